#!/usr/bin/env bash
# Long jobs on the device machine, over device calls of at most 10 minutes each. The machine is
# given back after ~30 s without a call, and with it every job and file: make the next call at
# once, and keep whatever is worth keeping under $OUT in every call (it comes back even when a
# call is cut at its limit).
#
#   bash bench/device_job.sh start NAME CMD [ARG...]   # CMD in the background (its own session),
#                                                      # output in /tmp/jobs/NAME.log
#   bash bench/device_job.sh poll SECONDS [FILE...]    # until every job has ended or SECONDS have
#                                                      # passed: every 15 s, each job's log tail
#                                                      # and each FILE to $OUT (by base name)
#   bash bench/device_job.sh status                    # each job: running, or its exit code
#   bash bench/device_job.sh finish NAME SECONDS PATH...
#                                                      # as poll, but until NAME has ended; then
#                                                      # PATH... packed into $OUT/NAME.tgz.NN
#                                                      # (15 MiB parts), so the call that sees
#                                                      # the job end brings its files back
#
# $OUT takes back at most 8 files (README of the device tool): a job's tail is one, each FILE
# one. Example (bench/real_model.py's chain beside the GPU tier):
#   bash bench/device_job.sh start chain python3 -m bench.real_model --out /tmp/rm_out ...
#   bash bench/device_job.sh start tier env OUT=/tmp/tier bash bench/gpu_tier.sh 600
#   bash bench/device_job.sh poll 540 /tmp/real/state.json     # again, call after call
#   bash bench/device_job.sh finish chain 540 /tmp/real/state.json /tmp/real/data
# On 2026-12-04 a chain's data was lost: its end was seen in one call, the packing was left to
# the next, and the machine was given back in between. ``finish`` does both in one call.
set -uo pipefail
jobs_dir=/tmp/jobs
mkdir -p "$jobs_dir"

running() {  # name: the job's process is still there
  local pid
  pid=$(cat "$jobs_dir/$1.pid" 2>/dev/null) || return 1
  kill -0 "$pid" 2>/dev/null
}

status() {
  local f name
  for f in "$jobs_dir"/*.pid; do
    [ -e "$f" ] || continue
    name=$(basename "$f" .pid)
    if running "$name"; then echo "$name: running"
    else echo "$name: ended, exit $(cat "$jobs_dir/$name.rc" 2>/dev/null || echo unknown)"; fi
  done
}

keep() {  # files...: job tails and the given files into $OUT
  local f
  [ -n "${OUT:-}" ] || return 0
  for f in "$jobs_dir"/*.log; do
    [ -e "$f" ] && tail -c 6000 "$f" >"$OUT/$(basename "$f" .log).tail"
  done
  for f in "$@"; do
    [ -e "$f" ] && cp "$f" "$OUT/$(basename "$f")"
  done
}

case ${1:-} in
start)
  name=${2:?NAME}; shift 2
  [ $# -gt 0 ] || { echo "start $name: give the command" >&2; exit 2; }
  if running "$name"; then echo "start $name: already running" >&2; exit 2; fi
  rm -f "$jobs_dir/$name.rc"
  # The exit code is written by the job's own shell, so a later call can read it.
  setsid nohup bash -c '"$@"; echo $? >'"$jobs_dir/$name.rc" job "$@" \
    >"$jobs_dir/$name.log" 2>&1 </dev/null &
  echo $! >"$jobs_dir/$name.pid"
  echo "$name: started (pid $!, log $jobs_dir/$name.log)"
  ;;
poll)
  seconds=${2:?SECONDS}; shift 2
  end=$((SECONDS + seconds))
  while [ $SECONDS -lt $end ]; do
    keep "$@"
    busy=0
    for f in "$jobs_dir"/*.pid; do
      [ -e "$f" ] && running "$(basename "$f" .pid)" && busy=1
    done
    [ $busy -eq 1 ] || break
    sleep 15
  done
  keep "$@"
  status
  ;;
finish)
  name=${2:?NAME}; seconds=${3:?SECONDS}; shift 3
  end=$((SECONDS + seconds))
  while running "$name" && [ $SECONDS -lt $end ]; do
    keep
    sleep 15
  done
  keep
  status
  if running "$name"; then echo "$name: still running, nothing packed"; exit 0; fi
  [ -n "${OUT:-}" ] || { echo "finish: \$OUT is not set" >&2; exit 2; }
  tar czf - "$@" | split -b 15M -d - "$OUT/$name.tgz."
  ls -l "$OUT/$name".tgz.*
  ;;
status)
  status
  ;;
*)
  echo "usage: device_job.sh start NAME CMD... | poll SECONDS [FILE...] | finish NAME SECONDS PATH... | status" >&2
  exit 2
  ;;
esac
