#!/bin/bash
# Linux MPTCP under one fault on link 1 for 3 s, with a chosen endpoint setup.
# Usage (root, after `cargo build --release -p surelink-cli`):
#   SRV=0.0.0.0 scripts/mptcp.sh <client-endpoint-flags|none> <fault> <stale_loss_cnt>
# e.g. `SRV=0.0.0.0 scripts/mptcp.sh none kill 2`; SRV (default 10.77.1.2) is the
# address the server listens on. Prints the longest gap between replies.
S=./target/release/surelink
$S testbed up >/dev/null
for ns in sl-a sl-b; do
  ip netns exec $ns sysctl -qw net.mptcp.enabled=1
  ip netns exec $ns sysctl -qw net.mptcp.stale_loss_cnt=$3
  ip netns exec $ns ip mptcp limits set subflow 2 add_addr_accepted 2
done
[ "$1" != "none" ] && ip netns exec sl-a ip mptcp endpoint add 10.77.2.1 dev sl-a2 $1
ip netns exec sl-b ip mptcp endpoint add 10.77.2.2 dev sl-b2 signal
ip netns exec sl-b $S experiment-tcp-node --server --mptcp --local ${SRV:-10.77.1.2}:7700 > /tmp/ms.log 2>&1 &
sleep 0.5
ip netns exec sl-a $S experiment-tcp-node --mptcp --peer 10.77.1.2:7700 --calls-ms 1 > /tmp/mc.log 2>&1 &
sleep 2
ip netns exec sl-a ss -Mn 2>/dev/null | head -3; ip netns exec sl-a ss -tn state established | grep 77 | head
date +%s%6N > /tmp/t_fault
$S testbed fault $2 --network 1 >/dev/null
sleep 3
$S testbed undo $2 --network 1 >/dev/null
sleep 2
kill %1 %2 2>/dev/null; sleep 0.3
$S testbed down >/dev/null
python3 - <<'PY'
import json
tf=int(open('/tmp/t_fault').read()); last=None; gap=0; n=0
for line in open('/tmp/mc.log'):
    try: v=json.loads(line)
    except: continue
    if v.get('ev')=='reply':
        n+=1
        t=v['t']
        if t>tf-1000000 and last is not None: gap=max(gap,t-last)
        last=t
    elif v.get('ev')!='peer_up': print(v)
print("replies", n, "longest gap %.0f ms" % (gap/1e3), "last reply %+.0f ms" % ((last-tf)/1e3 if last else -1))
PY
