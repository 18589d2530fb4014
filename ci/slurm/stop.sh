#!/usr/bin/env bash
# ci/slurm/stop.sh
# Stop the cluster ci/slurm/start.sh started: cancel every job, let their steps exit, then stop
# exactly the daemons whose PIDs start.sh recorded (TERM, then KILL after 10 s). Never matches
# processes by name. Safe to run twice.
set -uo pipefail
DIR=${FTBENCH_SLURM_DIR:-/tmp/ftbench-slurm}
[[ -d $DIR/pids ]] || { echo "no cluster recorded under $DIR"; exit 0; }
alive() { kill -0 "$1" 2>/dev/null; }

if [[ -s $DIR/pids/slurmctld.pid ]] && alive "$(<"$DIR/pids/slurmctld.pid")"; then
  scancel -u "$(id -un)" 2>/dev/null
  # slurmstepd must reap the job before slurmd goes, or its children outlive the cluster
  for _ in $(seq 100); do [[ -z $(squeue -h 2>/dev/null) ]] && break; sleep 0.1; done
fi
# the reverse of the start order
for d in slurmd slurmctld slurmdbd mariadbd munged; do
  f=$DIR/pids/$d.pid
  [[ -s $f ]] || continue
  pid=$(<"$f")
  if alive "$pid"; then
    kill -TERM "$pid"
    for _ in $(seq 100); do alive "$pid" || break; sleep 0.1; done
    if alive "$pid"; then kill -KILL "$pid"; echo "killed $d (pid $pid) after 10 s"; else echo "stopped $d (pid $pid)"; fi
  fi
  rm -f "$f"
done
rm -f /run/munge/munged.pid /run/mysqld/ftbench.pid
