#!/usr/bin/env bash
# Time to first result on a fresh Debian 12: a clean chroot built with debootstrap, a clean clone
# of this repository in it, then `bash scripts/run-default.sh` to a trained model, timed per
# phase (apt, build, import, train) and in total. Run as root on a Debian (or Ubuntu) host:
#
#   bash bench/fresh_install.sh                 # clones HEAD of this repository
#   bash bench/fresh_install.sh --ref issue-15  # any commit or branch of this repository
#   bash bench/fresh_install.sh --command "bash scripts/test.sh"   # the other command
#
# The base system (debootstrap's default variant of bookworm: Priority required + important, what
# a minimal Debian 12 install has) is made once and kept as a tarball in $WORK (default
# /var/tmp/dptrain-fresh); every run unpacks a new copy of it, so nothing installed by an
# earlier run is there, and the apt cache starts empty. Downloads come from the mirror
# ($MIRROR, default deb.debian.org) and are part of the apt phase, as on a new machine.
#
# Output: $WORK/run-<UTC time>/ holds log.txt (every line of the command, prefixed with the
# seconds since it started) and summary.txt (date, machine, commit, load before and after, exit
# status, the phases). The phases are the lines scripts/setup.sh and scripts/run-default.sh
# print ("setup: apt 21.3 s"); for an older checkout without them, landmarks in the log
# (cmake's first line, dptrain's banner).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
ref=HEAD
command="bash scripts/run-default.sh"
keep=0
while (($#)); do
  case $1 in
    --ref) ref=$2; shift 2 ;;
    --command) command=$2; shift 2 ;;
    --keep) keep=1; shift ;;   # keep the chroot afterwards (to look around)
    *) echo "usage: $0 [--ref REF] [--command CMD] [--keep]" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "fresh_install.sh: needs root (debootstrap, chroot, mount)" >&2; exit 2; }
WORK=${WORK:-/var/tmp/dptrain-fresh}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
mkdir -p "$WORK"

# ---- 1. the base system, made once ----
base=$WORK/bookworm-base.tar
if [ ! -f "$base" ]; then
  command -v debootstrap > /dev/null || { apt-get update -q && apt-get install -y -q debootstrap; }
  rm -rf "$WORK/base"
  debootstrap bookworm "$WORK/base" "$MIRROR"
  # The sources of an installed Debian 12: the release, its updates and its security updates.
  cat > "$WORK/base/etc/apt/sources.list" <<EOF
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
EOF
  chroot "$WORK/base" apt-get clean
  tar -C "$WORK/base" -cf "$base" . && rm -rf "$WORK/base"
fi

# ---- 2. a new copy, mounts, the clone ----
stamp=$(date -u +%Y%m%dT%H%M%SZ)
out=$WORK/run-$stamp
root=$out/root
mkdir -p "$root"
tar -C "$root" -xf "$base"
cp /etc/resolv.conf "$root/etc/resolv.conf"
mounts=()
mnt() { mount "$@" && mounts=("${!#}" "${mounts[@]}"); }
cleanup() {
  for m in "${mounts[@]}"; do umount -l "$m" 2> /dev/null || true; done
  ((keep)) || rm -rf "$root"
}
trap cleanup EXIT
mnt -t proc proc "$root/proc"
mnt -t sysfs sys "$root/sys"
mnt --bind /dev "$root/dev"
mnt --bind /dev/pts "$root/dev/pts"
mnt -t tmpfs tmpfs "$root/dev/shm"
git clone -q --no-local "$repo" "$root/root/dptrain"
git -C "$root/root/dptrain" checkout -q "$(git -C "$repo" rev-parse "$ref")"
commit=$(git -C "$root/root/dptrain" log -1 --format='%h %s' | cut -c1-100)

# ---- 3. the command, every line stamped with the seconds since it started ----
load_before=$(uptime)
# Microseconds from bash's own clock: stamping a line forks nothing (the machine is shared).
us() { local t=${EPOCHREALTIME/./}; echo "${t#0}"; }
times > "$out/times-before.txt"  # in this shell: a subshell would see no children
t0=$(us)
set +e
chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin CMD="$command" \
  bash -c 'cd /root/dptrain && exec stdbuf -oL -eL bash -c "$CMD"' < /dev/null 2>&1 |
  while IFS= read -r line; do
    d=$(($(us) - t0))
    printf '%5d.%d %s\n' $((d / 1000000)) $((d / 100000 % 10)) "$line"
  done > "$out/log.txt"
rc=${PIPESTATUS[0]}
set -e
d=$(($(us) - t0))
total=$((d / 1000000)).$((d / 100000 % 10))
# CPU seconds of everything the command ran (children of this shell), which the machine's load
# changes far less than the wall time.
times > "$out/times-after.txt"
cpu=$(tail -qn1 "$out/times-before.txt" "$out/times-after.txt" | tr 'ms' '  ' |
      awk '{ u[NR] = $1 * 60 + $2; s[NR] = $3 * 60 + $4 }
           END { printf "user %.1f s, system %.1f s", u[2] - u[1], s[2] - s[1] }')
load_after=$(uptime)

# ---- 4. the phases ----
# The first stamp of a line matching $1 (empty where none).
first() { grep -m1 -E "^ *[0-9.]+ ($1)" "$out/log.txt" | awk '{print $1}' || true; }
phases=$(grep -E '^ *[0-9.]+ (setup|run-default): ' "$out/log.txt" | sed -E 's/^ *[0-9.]+ //' || true)
if [ -z "$phases" ]; then
  c=$(first '-- The C'); m=$(first 'dptrain: ')
  phases=$(printf 'landmarks (no phase lines in this checkout): apt until cmake starts at %s s; build and import until the dptrain banner at %s s; train until the end at %s s' \
           "${c:--}" "${m:--}" "$total")
fi
{
  echo "date: $(date -u '+%F %T UTC')"
  echo "host: $(hostname), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/{print $2}') GiB"
  echo "base: debootstrap $(debootstrap --version | awk '{print $2}') bookworm (default variant), mirror $MIRROR"
  echo "commit: $commit"
  echo "command: $command"
  echo "load before: $load_before"
  echo "load after:  $load_after"
  echo "exit status: $rc"
  echo "total: $total s"
  echo "cpu time: $cpu"
  echo "$phases"
  grep -E 'final test accuracy|^ *[0-9.]+ done:' "$out/log.txt" | sed -E 's/^ *[0-9.]+ //' || true
} > "$out/summary.txt"
cat "$out/summary.txt"
echo "log: $out/log.txt"
exit "$rc"
