#!/usr/bin/env bash
# Install Debian's Prometheus, promtool, Alertmanager and amtool for the test harness.
# Idempotent: does nothing when the binaries are already present. Never starts a daemon:
# a policy-rc.d that denies every start is put in place before apt runs the postinst scripts.
set -euo pipefail
need=()
for bin in /usr/bin/prometheus /usr/bin/promtool /usr/bin/prometheus-alertmanager /usr/bin/amtool; do
  [ -x "$bin" ] || need+=("$bin")
done
if [ ${#need[@]} -eq 0 ]; then
  echo "install_servers: prometheus, promtool, alertmanager and amtool already installed"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager >/dev/null
# Belt and braces: if an init system started the packaged daemons anyway, stop them.
for svc in prometheus prometheus-alertmanager; do
  pkill -x "$svc" 2>/dev/null || true
done
/usr/bin/prometheus --version 2>&1 | head -1
/usr/bin/prometheus-alertmanager --version 2>&1 | head -1
