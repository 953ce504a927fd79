#!/usr/bin/env bash
# Install Debian's Prometheus, promtool, Alertmanager and amtool for the test harness.
# Idempotent: does nothing when the binaries are already present, and installs only the packages
# that are missing. Never starts a daemon and kills nothing by name (a Prometheus of the user's
# own is never touched):
# - Prevention: while apt runs, /usr/sbin/policy-rc.d denies every service action. Both ways a
#   Debian postinst starts a service (invoke-rc.d, and deb-systemd-invoke under systemd) ask it
#   first. We create it only when there is none, and remove it again on exit, also on failure
#   or interruption; a pre-existing one is left exactly as it was.
# - Fallback: a pre-existing policy may allow starts. So a service of a package that this run
#   installed (never one that was there before) is stopped again if it is running, through the
#   service manager: systemctl, or the package's init script, which stops by its own pid file.
set -euo pipefail
POLICY=/usr/sbin/policy-rc.d
need=()
[ -x /usr/bin/prometheus ] && [ -x /usr/bin/promtool ] || need+=(prometheus)
[ -x /usr/bin/prometheus-alertmanager ] && [ -x /usr/bin/amtool ] || need+=(prometheus-alertmanager)
if [ ${#need[@]} -eq 0 ]; then
  echo "install_servers: prometheus, promtool, alertmanager and amtool already installed"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

created_policy=0
remove_policy() {
  if [ "$created_policy" -eq 1 ]; then
    $SUDO rm -f "$POLICY"
    created_policy=0
  fi
}
trap remove_policy EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP
# noclobber makes the create atomic: it succeeds only when no policy file exists yet.
if $SUDO sh -c "set -C; printf '#!/bin/sh\nexit 101\n' > $POLICY" 2>/dev/null; then
  created_policy=1
  $SUDO chmod 755 "$POLICY"
elif [ ! -e "$POLICY" ]; then
  echo "install_servers: cannot create $POLICY, so the packaged daemons could start" >&2
  exit 1
fi

stop_if_running() {  # $1: the service of a package this run installed
  if [ -d /run/systemd/system ]; then
    if systemctl is-active --quiet "$1"; then $SUDO systemctl stop "$1"; fi
  elif [ -x "/etc/init.d/$1" ] && "/etc/init.d/$1" status >/dev/null 2>&1; then
    $SUDO "/etc/init.d/$1" stop
  fi
}

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
remove_policy
for svc in "${need[@]}"; do
  stop_if_running "$svc"
done
/usr/bin/prometheus --version 2>&1 | head -1
/usr/bin/prometheus-alertmanager --version 2>&1 | head -1
