.PHONY: smoke
