#!/bin/bash
# One outage of every link on the netns testbed, and how calls fare around it.
# Usage (root, after `cargo build --release -p surelink-cli`):
#   scripts/outage.sh <ms> <fault>     e.g. scripts/outage.sh 300 one-way
# Starts a receiver and a sender (one call per 5 ms, default configuration),
# applies <fault> to both networks for <ms>, prints detector events and the
# slowest reply (issue 12: the lost-SYN stall after a one-way outage).
S=./target/release/surelink
$S testbed up >/dev/null
rm -rf /tmp/okeys
ip netns exec sl-b $S experiment-node --role receiver --local 10.77.1.2:7600,10.77.2.2:7600 --key-dir /tmp/okeys > /tmp/rx.log 2>&1 < <(sleep 30) &
sleep 1
ip netns exec sl-a $S experiment-node --role sender --local 10.77.1.1:0,10.77.2.1:0 --peer 10.77.1.2:7600,10.77.2.2:7600 --stream-ms 0 --calls-ms 5 --key-dir /tmp/okeys > /tmp/tx.log 2>&1 < <(sleep 30) &
sleep 3
date +%s%6N > /tmp/t_fault
$S testbed fault $2 --network 1; $S testbed fault $2 --network 2
sleep $(echo "$1/1000" | bc -l)
$S testbed undo $2 --network 1; $S testbed undo $2 --network 2
date +%s%6N > /tmp/t_undo
sleep 4
kill %1 %2 2>/dev/null; sleep 0.5; rm -rf /tmp/okeys
$S testbed down >/dev/null
python3 - <<'PY'
import json
tf=int(open("/tmp/t_fault").read()); tu=int(open("/tmp/t_undo").read()); worst=[]
print("outage %.0f ms" % ((tu-tf)/1e3))
for line in open('/tmp/tx.log'):
    try: v=json.loads(line)
    except: continue
    if v.get('ev')=='reply':
        lat=(v['t']-v['sent'])/1e3
        if lat>30: worst.append((lat, (v["sent"]-tf)/1e3))
    elif v.get('ev') not in ('msg',):
        print("tx", v.get('ev'), "%+.0f ms" % ((v['t']-tf)/1e3), {k:v[k] for k in v if k not in ('t','ev')})
for line in open('/tmp/rx.log'):
    try: v=json.loads(line)
    except: continue
    if v.get('ev') not in ('msg',):
        print("rx", v.get('ev'), "%+.0f ms" % ((v['t']-tf)/1e3), {k:v[k] for k in v if k not in ('t','ev') and k!='listen'})
print('slow replies:', len(worst), 'max %.0f ms (sent at %+.0f ms)' % max(worst) if worst else 'none')
PY
