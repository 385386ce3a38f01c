#!/usr/bin/env bash
# `make images`: the project's three images (operator, enqueuer, worker) from its Dockerfile, and
# a pause image for the local node, built on this machine without Docker and without a registry.
#
#   tools/images/build.sh             build what changed; print the directory of the archives
#   tools/images/build.sh --help
#
# The Dockerfile is the one users build (`docker build --target worker .` on the official Python
# image). Here its base is a Debian image made from Debian's packages: debootstrap (minbase plus
# python3, venv, pip) with this machine's CA certificates trusted, so pip inside the build can
# reach PyPI through an intercepting proxy; added to an empty buildah image as $BASE_IMAGE. Then
# `buildah bud --layers --target X` builds each image (chroot isolation, the host's network: no
# bridge, cgroup or runtime is left behind), and `buildah push docker-archive:` writes each one
# to $OUT, named as the chart and the operator name them (docker.io/library/outbox-dispatcher-X:V),
# ready for `ctr images import` (the local node imports them when it starts).
#
# Cached: the base image is made again only when its recipe or the CA files change, the images
# reuse buildah's layer cache, and an archive is written again only when its image changed; a
# second run with no change takes seconds. Needs root and Debian's packages (installed when
# missing): debootstrap buildah gcc. OUTBOX_IMAGE_CACHE moves $OUT.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"

case "${1:-}" in
	"") ;;
	-h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "images/build.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
esac

say() { printf 'images: %s\n' "$*" >&2; }
fail() { printf 'images: %s\n' "$*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "needs root (buildah's store and debootstrap); run it as root"

version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/pyproject.toml" | head -n1)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/outbox-dispatcher"
out="${OUTBOX_IMAGE_CACHE:-$cache/images}"
suite=bookworm
base_image="localhost/debian-python:3.11-$suite"
pause_image="localhost/outbox-dispatcher-pause:3.10"
include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates
mkdir -p "$out"
started=$SECONDS

# Debian's packages, installed without starting their daemons (containerd's would start).
packages=(debootstrap buildah gcc libc6-dev)
missing=()
for p in "${packages[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p"); done
if ((${#missing[@]})); then
	say "installing ${missing[*]} from Debian"
	guard=0
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && guard=1
	fi
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	((guard)) && rm -f /usr/sbin/policy-rc.d
fi

# buildah without a bridge or a runtime: RUN steps in a chroot on the host's network.
export BUILDAH_ISOLATION=chroot STORAGE_DRIVER=overlay
bud=(buildah bud --quiet --layers --network host --build-arg "PYTHON_IMAGE=$base_image")

image_label() { buildah inspect --type image --format "{{index .ImageAnnotations \"$2\"}}{{index .OCIv1.Config.Labels \"$2\"}}" "$1" 2>/dev/null || true; }

# 1. The base: Debian's python3 in a minbase root, with the CA files of this machine.
ca_files=(/usr/local/share/ca-certificates/*.crt)
[ -e "${ca_files[0]}" ] || ca_files=()
base_stamp="$( (echo "$suite $include v2"; cat "${ca_files[@]}" /dev/null) | sha256sum | cut -c1-16)"
if [ "$(image_label "$base_image" dev.outbox-dispatcher.stamp)" != "$base_stamp" ]; then
	say "making $base_image with debootstrap (about a minute)"
	rootfs="$(mktemp -d "$cache/rootfs.XXXXXX")"
	trap 'umount -R "$rootfs/proc" 2>/dev/null || true; rm -rf "$rootfs" "$rootfs.tar"' EXIT
	debootstrap --variant=minbase --include="$include" "$suite" "$rootfs" http://deb.debian.org/debian >"$out/debootstrap.log" 2>&1 ||
		fail "debootstrap failed; the end of $out/debootstrap.log: $(tail -n3 "$out/debootstrap.log")"
	if ((${#ca_files[@]})); then cp "${ca_files[@]}" "$rootfs/usr/local/share/ca-certificates/"; fi
	chroot "$rootfs" update-ca-certificates >/dev/null
	rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
	tar -C "$rootfs" --numeric-owner -cf "$rootfs.tar" .
	container="$(buildah from scratch)"
	buildah add --quiet "$container" "$rootfs.tar" / >/dev/null
	buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		--env LANG=C.UTF-8 --label "dev.outbox-dispatcher.stamp=$base_stamp" --cmd python3 "$container"
	buildah commit --quiet --rm "$container" "$base_image" >/dev/null
	rm -f "$rootfs.tar"
	rm -rf "$rootfs"
	trap - EXIT
fi

# 2. The pause image: Kubernetes' pause.c (from the k8s.io/kubernetes module the node is built
# from), static, FROM scratch.
pause_c="$(cd "$root/tools/k8s" && go list -m -f '{{.Dir}}' k8s.io/kubernetes 2>/dev/null)/build/pause/linux/pause.c"
[ -f "$pause_c" ] || (cd "$root/tools/k8s" && GOFLAGS=-mod=mod go mod download k8s.io/kubernetes)
pause_c="$(cd "$root/tools/k8s" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c"
pause_stamp="$(sha256sum "$pause_c" | cut -c1-16)"
if [ "$(image_label "$pause_image" dev.outbox-dispatcher.stamp)" != "$pause_stamp" ]; then
	say "building $pause_image"
	work="$(mktemp -d)"
	gcc -Os -static -DVERSION=v3.10-outbox-dispatcher -o "$work/pause" "$pause_c"
	strip "$work/pause"
	printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nLABEL dev.outbox-dispatcher.stamp=%s\nENTRYPOINT ["/pause"]\n' "$pause_stamp" >"$work/Containerfile"
	buildah bud --quiet -t "$pause_image" -f "$work/Containerfile" "$work" >/dev/null
	rm -rf "$work"
fi

# 3. The project's images, then an archive per image whose content changed.
export_image() { # local name, the name in the archive
	local file="$out/${2##*/}"
	file="${file%%:*}.tar"
	local id
	id="$(buildah inspect --type image --format '{{.FromImageID}}' "$1")"
	if [ "$(cat "$file.id" 2>/dev/null)" != "$id" ] || [ ! -s "$file" ]; then
		rm -f "$file" "$file.id"
		buildah push --quiet "$1" "docker-archive:$file:$2" >/dev/null
		echo "$id" >"$file.id"
		say "exported $2"
	fi
}
# Nothing of the build context, the Dockerfile or the base changed since the last build: the
# archives stand (buildah's own cache check walks the venv of every stage: tens of seconds).
context_stamp="$( (cd "$root" && cat Dockerfile && echo "$base_stamp $pause_stamp" &&
	find pyproject.toml README.md dispatcher -type f ! -path '*__pycache__*' ! -name '*.pyc' -print0 |
	sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-16)"
archives=("$out"/outbox-dispatcher-{operator,enqueuer,worker,pause}.tar)
if [ "$(cat "$out/context.stamp" 2>/dev/null)" = "$context_stamp" ] && ls "${archives[@]}" >/dev/null 2>&1; then
	say "nothing changed since the last build ($((SECONDS - started)) s); archives in $out"
	echo "$out"
	exit 0
fi
rm -f "$out/context.stamp"
for target in operator enqueuer worker; do
	say "building outbox-dispatcher-$target:$version (buildah, cached layers)"
	"${bud[@]}" --target "$target" -t "localhost/outbox-dispatcher-$target:$version" -f "$root/Dockerfile" "$root" >/dev/null
	export_image "localhost/outbox-dispatcher-$target:$version" "docker.io/library/outbox-dispatcher-$target:$version"
done
export_image "$pause_image" "$pause_image"
echo "$context_stamp" >"$out/context.stamp"
say "done in $((SECONDS - started)) s; archives in $out"
echo "$out"
