#!/bin/sh
# After install or removal: make systemd read the units again. Nothing is
# enabled or started; that is the administrator's choice.
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || true
fi
