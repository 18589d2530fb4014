"""The orchestration floor: what drives the other parts, one make target each. Dependencies point
one way: pipelines -> sweeps -> experiments -> model -> common. A pipeline runs each stage in
its own process through the stage's entry point and learns progress from the records jobs
write, never from printed lines. Nothing imports pipelines.
"""
