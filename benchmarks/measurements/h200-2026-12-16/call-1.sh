#!/bin/bash
# Twenty-second session, call 1: where a host-bound ZeRO-3 step's time goes (profiles with the host's waits traced to
# their callers, six timed steps each), then the same layouts over 10 steps in three processes (predicted before).
F=benchmarks/measurements/h200-2026-12-16
DEADLINE=${DEADLINE:-570} TIMED_STEPS=6 PROF_FLAGS=--stacks bash benchmarks/measurements/tools/device_call.sh setup-gpu \
  prof:$F/batch-prof-b.txt:1 prof:$F/batch-prof-b.txt:2 fam:$F/batch-steps-a.txt
cd $OUT && tar czf profiles.tgz prof-*.json 2>/dev/null; ls -la $OUT
