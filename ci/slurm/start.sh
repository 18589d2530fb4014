#!/usr/bin/env bash
# ci/slurm/start.sh
# Start a throwaway single-node SLURM cluster (munged, mariadbd, slurmdbd, slurmctld, slurmd) on a
# Debian 12 host without systemd, for the tests that submit real jobs (tests/test_slurm.py).
# Needs root. Idempotent: a daemon whose recorded PID is alive is left alone.
#
#   sudo ci/slurm/start.sh        # then: sbatch --wrap hostname; sacct
#   sudo ci/slurm/stop.sh         # cancels jobs, stops exactly the PIDs recorded here
#
# Environment:
#   FTBENCH_SLURM_DIR    state, logs and PID files (default /tmp/ftbench-slurm)
#   FTBENCH_SLURM_APT=0  never run apt-get (fail if a package is missing)
#   FTBENCH_SLURM_DBD=0  no mariadb/slurmdbd: faster, but no sacct (submitit then cannot tell a
#                        killed job from a running one and job.result() may wait forever)
# Prints one line per stage with the seconds since start; the last line is "slurm up in N s".
set -euo pipefail

DIR=${FTBENCH_SLURM_DIR:-/tmp/ftbench-slurm}
DBD=${FTBENCH_SLURM_DBD:-1}
CONF=/etc/slurm/slurm.conf
MARK="# written by ftbench ci/slurm/start.sh"
T0=$EPOCHREALTIME
since() { awk -v a="$T0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
say() { printf '[slurm %5ss] %s\n' "$(since)" "$*"; }
die() { echo "ci/slurm/start.sh: $*" >&2; exit 2; }
running() { [[ -s $1 ]] && kill -0 "$(<"$1")" 2>/dev/null; }
# wait_for <tenths of a second> <command...>: poll until the command succeeds
wait_for() { local n=$1; shift; for ((i = 0; i < n; i++)); do "$@" &>/dev/null && return 0; sleep 0.1; done; return 1; }

[[ $(id -u) == 0 ]] || die "needs root (it starts system daemons and writes $CONF)"
mkdir -p "$DIR"/{pids,log,ctld,spool}

# ------------------------------------------------------------------ packages
pkgs=(slurmctld slurmd slurm-client munge)
bins=(slurmctld slurmd sbatch munged)
[[ $DBD == 1 ]] && pkgs+=(slurmdbd mariadb-server) && bins+=(slurmdbd mariadbd)
missing=0; for b in "${bins[@]}"; do command -v "$b" >/dev/null || missing=1; done
if ((missing)); then
  [[ ${FTBENCH_SLURM_APT:-1} == 1 ]] || die "missing one of ${bins[*]} and FTBENCH_SLURM_APT=0"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # the packages' postinst try to start services; without systemd that fails harmlessly
  apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >"$DIR/log/apt.log" 2>&1 \
    || { tail -5 "$DIR/log/apt.log" >&2; die "apt-get install ${pkgs[*]} failed"; }
  say "installed ${pkgs[*]}"
fi

# ------------------------------------------------------------------ slurm.conf
# Never overwrite a real cluster's configuration.
if [[ -e $CONF ]] && ! grep -qF "$MARK" "$CONF"; then
  die "$CONF exists and was not written by this script; refusing to replace it"
fi
host=$(hostname -s)
addr=$(getent hosts "$host" | awk '{print $1; exit}')
# slurmd drains a node that claims more memory than it measures: declare 90 %
# (what slurmd measures, not nproc: nproc obeys OMP_NUM_THREADS)
hw=$(slurmd -C)
cpus=$(grep -o 'CPUs=[0-9]*' <<<"$hw" | cut -d= -f2)
mem=$(grep -o 'RealMemory=[0-9]*' <<<"$hw" | cut -d= -f2)
mem=$((mem * 9 / 10))
if [[ $DBD == 1 ]]; then
  acct=$'AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost'
else
  acct="AccountingStorageType=accounting_storage/none"
fi
mkdir -p /etc/slurm
cat >"$CONF" <<CONFEOF
$MARK
ClusterName=ftbench
SlurmctldHost=$host(${addr:-127.0.0.1})
SlurmUser=root
AuthType=auth/munge
# a requeued job may start again after cred_expire seconds (default 120)
AuthInfo=cred_expire=5
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/pids/slurmctld.pid
SlurmdPidFile=$DIR/pids/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
# no cgroup hierarchy to manage in a container
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
$acct
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=256
JobRequeue=1
ReturnToService=2
MinJobAge=600
KillWait=5
InactiveLimit=0
Waittime=0
MpiDefault=none
NodeName=$host NodeAddr=${addr:-127.0.0.1} CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=ci Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONFEOF
say "wrote $CONF (node $host, $cpus CPUs, ${mem} MB)"

# ------------------------------------------------------------------ munge
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
[[ -s /etc/munge/munge.key ]] || mungekey --create --keyfile=/etc/munge/munge.key
chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
if ! running "$DIR/pids/munged.pid"; then
  runuser -u munge -- munged --pid-file=/run/munge/munged.pid
  wait_for 50 bash -c 'munge -n | unmunge' || die "munged did not answer (see /var/log/munge)"
  cp /run/munge/munged.pid "$DIR/pids/munged.pid"
fi
say "munged pid $(<"$DIR/pids/munged.pid")"

# ------------------------------------------------------------------ accounting (sacct)
if [[ $DBD == 1 ]]; then
  install -d -o mysql -g mysql /run/mysqld
  [[ -d /var/lib/mysql/mysql ]] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql \
    >"$DIR/log/mariadb-install.log" 2>&1
  if ! running "$DIR/pids/mariadbd.pid"; then
    # its pid and log files go where the mysql user may write ($DIR may sit under a 0700
    # directory such as pytest's); the pid is then copied next to the others
    rm -f /run/mysqld/ftbench.pid
    setsid -f mariadbd --user=mysql --datadir=/var/lib/mysql --socket=/run/mysqld/mysqld.sock \
      --bind-address=127.0.0.1 --innodb-buffer-pool-size=32M --pid-file=/run/mysqld/ftbench.pid \
      --log-error=/run/mysqld/ftbench.log </dev/null &>/dev/null
    wait_for 200 mariadb-admin ping || die "mariadbd did not start (see /run/mysqld/ftbench.log)"
    wait_for 50 test -s /run/mysqld/ftbench.pid
    cp /run/mysqld/ftbench.pid "$DIR/pids/mariadbd.pid"
  fi
  say "mariadbd pid $(<"$DIR/pids/mariadbd.pid")"
  if ! running "$DIR/pids/slurmdbd.pid"; then
    # slurmctld -c below restarts job ids at 1: old rows with the same ids would answer sacct
    mariadb -e "DROP DATABASE IF EXISTS ftbench_acct;
      CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'ftbench-ci';
      GRANT ALL ON ftbench_acct.* TO 'slurm'@'localhost';"
    install -m 0600 /dev/stdin /etc/slurm/slurmdbd.conf <<DBDEOF
$MARK
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
LogFile=$DIR/log/slurmdbd.log
PidFile=$DIR/pids/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=ftbench-ci
StorageLoc=ftbench_acct
DBDEOF
    slurmdbd
    wait_for 150 sacctmgr -n list cluster || die "slurmdbd did not answer (see $DIR/log/slurmdbd.log)"
    sacctmgr -i -Q add cluster ftbench &>/dev/null || true
  fi
  say "slurmdbd pid $(<"$DIR/pids/slurmdbd.pid")"
fi

# ------------------------------------------------------------------ controller + node
# -c: forget saved jobs, a fresh cluster every time (job ids restart at 1: use a fresh submitit
# folder per start, or an old <folder>/<id>_result.pkl answers for a new job)
running "$DIR/pids/slurmctld.pid" || slurmctld -c
wait_for 100 bash -c 'scontrol ping | grep -q UP' || die "slurmctld down (see $DIR/log/slurmctld.log)"
say "slurmctld pid $(<"$DIR/pids/slurmctld.pid")"
running "$DIR/pids/slurmd.pid" || slurmd
node_ready() { sinfo -h -N -o %T | grep -Eq '^(idle|mixed|allocated)'; }
if ! wait_for 100 node_ready; then
  scontrol update nodename="$host" state=resume &>/dev/null || true
  wait_for 50 node_ready || die "node $host not idle: $(sinfo -h -N -o '%T %E') (see $DIR/log/slurmd.log)"
fi
say "slurmd pid $(<"$DIR/pids/slurmd.pid"), node $(sinfo -h -N -o %T)"
echo "slurm up in $(since) s; stop with ci/slurm/stop.sh (FTBENCH_SLURM_DIR=$DIR)"
