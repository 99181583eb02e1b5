#!/bin/bash
# Harbor runs this after the agent. Reward 0 is written first so that any failure
# below (a missing file, a crash, a hang) still leaves a reward; 1 only when every
# hidden check in check.py passes. Reward files left by the agent are removed
# first (Harbor would read a reward.json before reward.txt).
mkdir -p /logs/verifier
rm -rf /logs/verifier/reward.json /logs/verifier/reward.txt
echo 0 > /logs/verifier/reward.txt
if timeout 90 python3 /tests/check.py; then
    echo 1 > /logs/verifier/reward.txt
fi
