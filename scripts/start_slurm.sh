#!/usr/bin/env bash
# A real single-node Slurm on this machine, from Debian's packages: munge, slurmctld, slurmd, slurm-client.
# One node with the machine's CPUs and memory, one partition "debug". Idempotent: returns at once when `sinfo`
# already shows the node up. Needs root (installs packages, starts daemons); CI runs it from scripts/test_services.sh.
#
#   sudo scripts/start_slurm.sh          # then: sinfo  ->  debug* up infinite 1 idle <host>
#
# Environment: SLURM_CONF_DIR (default /etc/slurm), SLIME_SLURM_LOG (default /var/log/slurm).
set -euo pipefail

log() { echo "start_slurm: $*" >&2; }

node_state() { timeout 10 sinfo -h -o %t 2>/dev/null | head -1 || true; }

if command -v sinfo >/dev/null 2>&1; then
  st=$(node_state)
  case "$st" in
    idle*|mix*|alloc*|comp*) log "Slurm is up (node $st)"; exit 0 ;;
  esac
fi

if [ "$(id -u)" != 0 ]; then
  log "must run as root (installs packages and starts daemons)"
  exit 1
fi

need=()
for p in munge slurmctld slurmd slurm-client; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  timeout 600 apt-get update -qq
  timeout 900 apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

conf_dir=${SLURM_CONF_DIR:-/etc/slurm}
log_dir=${SLIME_SLURM_LOG:-/var/log/slurm}
host=$(hostname -s)
cpus=$(nproc --all)
mem_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
mkdir -p "$conf_dir" "$log_dir" /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /run/munge /var/log/munge
slurm_user=root
if id slurm >/dev/null 2>&1; then
  slurm_user=slurm
  chown -R slurm: /var/lib/slurm/slurmctld "$log_dir"
fi

# munge: a key (the package's postinst normally makes one), then the daemon
if [ ! -s /etc/munge/munge.key ]; then
  log "creating the munge key"
  if command -v mungekey >/dev/null 2>&1; then mungekey --create --force 2>/dev/null || true; fi
  [ -s /etc/munge/munge.key ] || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
fi
if id munge >/dev/null 2>&1; then
  chown -R munge: /etc/munge /var/lib/munge /var/log/munge /run/munge 2>/dev/null || true
  chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
fi
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  log "starting munged"
  pkill -x munged 2>/dev/null || true  # a stale daemon of ours (no other munged runs on a CI machine)
  rm -f /run/munge/munge.socket.2*
  if id munge >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged --force
  else
    /usr/sbin/munged --force
  fi
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi

cat > "$conf_dir/slurm.conf" <<EOF
# written by slime-actors scripts/start_slurm.sh: one node, this machine
ClusterName=slime
SlurmctldHost=$host(127.0.0.1)
SlurmUser=$slurm_user
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$log_dir/slurmctld.log
SlurmdLogFile=$log_dir/slurmd.log
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
InactiveLimit=0
KillWait=10
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=60
Waittime=0
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
# slurm 22.05 reads cgroup.conf only for cgroup plugins; keep one that does nothing harmful
[ -f "$conf_dir/cgroup.conf" ] || echo "CgroupPlugin=autodetect" > "$conf_dir/cgroup.conf"

if ! pgrep -x slurmctld >/dev/null; then
  log "starting slurmctld"
  /usr/sbin/slurmctld -i
fi
if ! pgrep -x slurmd >/dev/null; then
  log "starting slurmd"
  /usr/sbin/slurmd
fi

for _ in $(seq 60); do
  st=$(node_state)
  case "$st" in
    idle*|mix*|alloc*) log "Slurm is up (node $st)"; exit 0 ;;
    down*|drain*) timeout 10 scontrol update nodename="$host" state=resume 2>/dev/null || true ;;
  esac
  sleep 1
done
log "Slurm did not come up; node state: '$(node_state)'; see $log_dir/slurmctld.log and slurmd.log"
tail -5 "$log_dir/slurmctld.log" "$log_dir/slurmd.log" >&2 2>/dev/null || true
exit 1
