#!/usr/bin/env bash
# The small repository the stand-in campaign's tasks name: the stand-in
# server (examples/seed-threeway/server.py) through 12 releases, one base
# commit per task (tags `tNN-base`), and the human changes some tasks name as
# refs (tags `tNN-human`). Fixed author and dates: the same commits anywhere.
#
#   examples/campaign-standin/make-repo.sh [DIR]    # default: examples/campaign-standin/repo
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-$here/repo}
rm -rf "$dir"
mkdir -p "$dir"
cd "$dir"
export GIT_AUTHOR_NAME=orch GIT_AUTHOR_EMAIL=orch@example.invalid
export GIT_COMMITTER_NAME=orch GIT_COMMITTER_EMAIL=orch@example.invalid
git init -q -b main .
git config commit.gpgsign false
n=0
commit() {
  n=$((n + 1))
  export GIT_AUTHOR_DATE="2026-01-01T00:$(printf %02d $((n / 60))):$(printf %02d $((n % 60)))+0000"
  export GIT_COMMITTER_DATE=$GIT_AUTHOR_DATE
  git add -A
  git commit -q -m "$1"
}
apply() {
  git apply "$here/patches/$1" || { echo "make-repo.sh: patches/$1 does not apply to the stand-in server" >&2; exit 1; }
}
cp "$here/../seed-threeway/server.py" server.py
printf '# The stand-in server\n\nreleases:\n' > CHANGES.md
commit "the stand-in server"
for i in 01 02 03 04 05 06 07 08 09 10 11 12; do
  printf -- '- release %s\n' "$i" >> CHANGES.md
  commit "release $i"
  if [ "$i" = 10 ]; then
    # Task 10's base preallocates a KV pool too large for any GPU.
    git checkout -q -b "t$i"
    apply oom-at-start.patch
    commit "release $i: preallocate the KV pool"
    git tag "t$i-base"
    apply live-cache.patch
    commit "release $i: read only the live cache"
    git tag "t$i-human"
    git checkout -q main
    continue
  fi
  git tag "t$i-base"
  # The human change as a commit on its own branch.
  git checkout -q -b "t$i"
  apply live-cache.patch
  commit "release $i: read only the live cache"
  git tag "t$i-human"
  git checkout -q main
done
# Every agent patch that should apply does (`does-not-apply.patch` must not).
git checkout -q t01-base
for p in live-cache chunked-cache slower window early-stop usage-lie oom-at-start; do
  git apply --check "$here/patches/$p.patch" || { echo "make-repo.sh: patches/$p.patch does not apply" >&2; exit 1; }
done
if git apply --check "$here/patches/does-not-apply.patch" 2>/dev/null; then
  echo "make-repo.sh: patches/does-not-apply.patch applies" >&2
  exit 1
fi
git checkout -q main
echo "$dir: $(git rev-list --all --count) commits, $(git tag | wc -l) tags"
