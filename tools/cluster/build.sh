#!/usr/bin/env bash
# Builds the local control plane's binaries (etcd, kube-apiserver, kube-controller-manager,
# kubectl, helm) from the Go modules pinned in tools/k8s/go.mod, into a cache outside the work
# tree, and prints that cache's bin directory. Idempotent: a second run finds the binaries
# stamped with this go.mod/go.sum and returns in a moment. OUTBOX_K8S_CACHE overrides the cache.
set -euo pipefail
here="$(cd "$(dirname "$0")/../k8s" && pwd)"

k8s_version=v1.37.2
helm_version=v4.3.2
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy helm)

cache="${OUTBOX_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/outbox-dispatcher/k8s-$k8s_version}"
bin="$cache/bin"
stamp="$(cat "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-16)"

built() {
	[ "$(cat "$bin/.stamp" 2>/dev/null)" = "$stamp" ] || return 1
	for b in "${binaries[@]}"; do [ -x "$bin/$b" ] || return 1; done
}

if built; then
	echo "$bin"
	exit 0
fi

command -v go >/dev/null || { echo "build.sh: needs Go >= 1.26 (go.dev/dl or Debian's golang)" >&2; exit 1; }
mkdir -p "$bin"
rm -f "$bin/.stamp"

export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod -trimpath"
# A module build has no release stamp of its own: give the binaries the versions that kubectl,
# helm's kubeVersion checks and the API's /version report.
minor="${k8s_version#v1.}"
minor="${minor%%.*}"
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	kube_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
	kube_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

started=$SECONDS
cd "$here"
echo "build.sh: building Kubernetes $k8s_version, helm $helm_version and etcd into $bin (a cold build takes a while)" >&2
go build -ldflags "$kube_ldflags" -o "$bin/" \
	k8s.io/kubernetes/cmd/kube-apiserver \
	k8s.io/kubernetes/cmd/kube-controller-manager \
	k8s.io/kubernetes/cmd/kube-scheduler \
	k8s.io/kubernetes/cmd/kubectl \
	k8s.io/kubernetes/cmd/kubelet \
	k8s.io/kubernetes/cmd/kube-proxy
go build -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$helm_version" -o "$bin/helm" helm.sh/helm/v4/cmd/helm
go build -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3
echo "$stamp" >"$bin/.stamp"
echo "build.sh: built in $((SECONDS - started)) s" >&2
echo "$bin"
