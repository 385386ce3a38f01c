#!/usr/bin/env bash
# The machine's services for a developer: PostgreSQL, Redis and PgBouncer from Debian's packages,
# PostgreSQL trusting loopback connections, PostgreSQL on 127.0.0.1:5432 and Redis on
# 127.0.0.1:6379 started when nothing answers there. Idempotent: a second run changes nothing.
#
#   tools/services.sh            install what is missing and start both (`make services`)
#   tools/services.sh --install  install what is missing, start nothing
#
# The test suite needs only the binaries: it starts its own throwaway servers on free ports and
# never touches these. `dispatcher demo`, `make bench` and `make soak` use these when they answer.
set -euo pipefail

start=1
case "${1:-}" in
  --install) start=0 ;;
  "") ;;
  -h | --help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "tools/services.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
esac

say() { printf '== %s\n' "$*"; }
[ "$(id -u)" = 0 ] && sudo=() || sudo=(sudo)

need=()
command -v redis-server >/dev/null || need+=(redis-server)
[ -x /usr/bin/pg_ctlcluster ] && ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
[ -x /usr/sbin/pgbouncer ] || command -v pgbouncer >/dev/null || need+=(pgbouncer)
command -v make >/dev/null || need+=(make)
# The local control plane (make cluster, tests/e2e): certificates and the Pods' network namespaces.
command -v openssl >/dev/null || need+=(openssl)
command -v ip >/dev/null || need+=(iproute2)
# The console's browser tests (tests/browser): headless Chromium and its WebDriver, never downloaded.
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)
# The local cluster's node (tools/cluster): Debian's containerd and runc, the CNI plugins,
# iptables and conntrack for kube-proxy. Installed, never started as a service.
command -v containerd >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
command -v iptables >/dev/null || need+=(iptables)
command -v conntrack >/dev/null || need+=(conntrack)
if ((${#need[@]})); then
  say "installing ${need[*]} from Debian"
  # No daemon starts from apt (containerd would, with the machine's default paths).
  guard=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee /usr/sbin/policy-rc.d >/dev/null
    "${sudo[@]}" chmod +x /usr/sbin/policy-rc.d
    guard=1
  fi
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${need[@]}" >/dev/null
  ((guard)) && "${sudo[@]}" rm -f /usr/sbin/policy-rc.d
fi
((start)) || exit 0

# PostgreSQL: the newest installed cluster, trusting loopback (a developer machine, not a server).
version="$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n1)"
if [ -z "$version" ]; then
  version="$(ls /usr/lib/postgresql | sort -V | tail -n1)"
  say "creating PostgreSQL $version cluster main"
  "${sudo[@]}" pg_createcluster "$version" main >/dev/null
fi
hba="/etc/postgresql/$version/main/pg_hba.conf"
if grep -Eq '^host\s+all\s+all\s+(127\.0\.0\.1/32|::1/128)\s+(md5|scram-sha-256|peer|ident)' "$hba"; then
  say "PostgreSQL $version: trusting loopback connections ($hba)"
  "${sudo[@]}" sed -Ei 's/^(host\s+all\s+all\s+(127\.0\.0\.1\/32|::1\/128)\s+)(md5|scram-sha-256|peer|ident)/\1trust/' "$hba"
  if pg_isready -h 127.0.0.1 -p 5432 -q; then
    "${sudo[@]}" pg_ctlcluster --skip-systemctl-redirect "$version" main reload
  fi
fi
if ! pg_isready -h 127.0.0.1 -p 5432 -q; then
  say "starting PostgreSQL $version on 127.0.0.1:5432"
  "${sudo[@]}" pg_ctlcluster --skip-systemctl-redirect "$version" main start
fi

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  say "starting Redis on 127.0.0.1:6379"
  "${sudo[@]}" mkdir -p /var/lib/redis /var/log/redis
  "${sudo[@]}" redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --appendonly yes \
    --dir /var/lib/redis --logfile /var/log/redis/dev.log
fi

for _ in $(seq 1 60); do
  pg_isready -h 127.0.0.1 -p 5432 -q && redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break
  sleep 0.5
done
pg_isready -h 127.0.0.1 -p 5432 -q || { echo "PostgreSQL did not come up: see /var/log/postgresql/" >&2; exit 1; }
redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null || { echo "Redis did not come up: see /var/log/redis/dev.log" >&2; exit 1; }
psql -h 127.0.0.1 -U postgres -Atc 'SELECT 1' postgres >/dev/null ||
  { echo "PostgreSQL answers but refuses postgres@127.0.0.1 without a password: check $hba" >&2; exit 1; }
say "PostgreSQL postgresql://postgres@127.0.0.1:5432/postgres and Redis redis://127.0.0.1:6379/0 are up"
