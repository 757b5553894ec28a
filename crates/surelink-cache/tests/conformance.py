#!/usr/bin/python3
"""Conformance of the surelink cache proxy with a real memcached.

Runs the same requests against both, in the same order, from empty, and
asserts identical answers:

- raw byte sequences (good commands, every error path memcached has for the
  command set: malformed lines, bad data chunks, long keys, huge lengths,
  noreply, numbers as memcached reads them), answers compared byte for byte
  (CAS uniques masked: each server counts its own);
- the command set through pymemcache, an unmodified client nobody here
  wrote: get/gets/set/add/replace/append/prepend/cas/delete/incr/decr/
  touch, each with and without noreply, plus version and stats shapes.

Usage: conformance.py PROXY_HOST:PORT MEMCACHED_HOST:PORT
Exit status 0 when every answer matched; the differences are printed.
"""

import re
import socket
import sys
import time

from pymemcache.client.base import Client


def addr(s):
    host, port = s.rsplit(":", 1)
    return host, int(port)


def raw(server, data, wait=0.25):
    s = socket.create_connection(server)
    s.sendall(data)
    s.settimeout(wait)
    out = b""
    # A case ending in `mn` is answered whole once every `mn`'s `MN` came.
    done = data.endswith(b"mn\r\n")
    want = sum(1 for line in data.split(b"\n") if line.split(b" ")[0].strip(b"\r") == b"mn")
    try:
        while True:
            b = s.recv(1 << 20)
            if not b:
                out += b"<closed>"
                break
            out += b
            if done and out.endswith(b"MN\r\n") and out.count(b"MN\r\n") >= want:
                break
    except socket.timeout:
        pass
    s.close()
    return out


CAS = re.compile(rb"^(VALUE \S+ \d+ \d+) \d+\r$", re.M)


VERSION = re.compile(rb"^VERSION \S+\r$", re.M)


# A meta answer's CAS token (` c123`), and `me`'s cas, slab class and
# item size (the nodes' stores have no slab classes: docs/cache.md).
META_CAS = re.compile(rb"^((?:VA \d+|HD|EX|NS|NF)(?: \S+)*?) c\d+", re.M)
ME_FIELDS = re.compile(rb"^(ME \S+) exp=(-1|-?\d+) la=\d+ cas=\d+ (fetch=\w+) cls=\d+ size=\d+\r$", re.M)


def mask(b):
    """CAS uniques, the version string and slab details differ by design."""
    b = VERSION.sub(b"VERSION <v>\r", CAS.sub(rb"\1 <cas>\r", b))
    for _ in range(4):
        b = META_CAS.sub(rb"\1 c<cas>", b)
    # (`exp` and `la` are seconds that differ between the two runs.)
    return ME_FIELDS.sub(lambda m: m.group(1) + b" exp=" + (b"-1" if m.group(2) == b"-1" else b"<t>") + b" la=<t> cas=<cas> " + m.group(3) + b" <slab>\r", b)


def binary(opcode, opaque):
    """A binary-protocol request without key, extras or body."""
    return bytes([0x80, opcode, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]) + opaque.to_bytes(4, "big") + bytes(8)


def big(n):
    return b"x" * n


RAW_CASES = [
    b"set a 0 0 1\r\nx\r\nget a\r\n",
    b"set a 0 0 1 noreply\r\nx\r\nget a\r\n",
    b"set a 0 0 2\r\nxyz\r\nget a\r\n",
    b"set a 0 0 2 noreply\r\nxyz\r\nget a\r\n",
    b"set " + b"k" * 251 + b" 0 0 1\r\nx\r\n",
    b"set " + b"k" * 251 + b" 0 0 1 noreply\r\nx\r\n",
    b"set " + b"k" * 250 + b" 0 0 1\r\nx\r\nget " + b"k" * 250 + b"\r\n",
    b"set a 0 0 -1\r\nx\r\n",
    b"set a abc 0 1\r\nx\r\n",
    b"set a -1 0 1\r\nx\r\n",
    b"set a 0 0\r\n",
    b"set a 0 0 1 2 3\r\n",
    b"set a 4294967296 0 1\r\nx\r\nget a\r\n",
    b"set a 4294967295 0 1\r\nx\r\nget a\r\n",
    b"set a +1 0 01\r\nx\r\nget a\r\n",
    b"set a 0 99999999999 1\r\nx\r\nget a\r\n",
    b"set a 0 -1 1\r\nx\r\nget a\r\n",
    b"set a 0 0 1 junk\r\nx\r\nget a\r\n",
    b"set a 0 0 2000000\r\n" + big(2000000) + b"\r\nget a\r\n",
    b"set a 0 0 1\r\nx\r\nset a 0 0 2000000 noreply\r\n" + big(2000000) + b"\r\nget a\r\n",
    b"set a 0 0 1048000\r\n" + big(1048000) + b"\r\nget a\r\n",
    b"GET a\r\n",
    b"get\r\n",
    b"gets\r\n",
    b"get " + b"k" * 251 + b"\r\n",
    # (Not after a set in the same packet: memcached 1.6 then also drops the
    # set's STORED, an artefact of how it batches answers per read.)
    b"get a " + b"k" * 251 + b" a\r\n",
    b"set a 0 0 1\r\nx\r\nget a a a nope a\r\n",
    b"get " + b"k " * 1500 + b"\r\n",
    b"bogus\r\n",
    b"\r\n",
    b"set  a  0 0 1\r\nx\r\nget  a\r\n",
    b"set a 0 0 1\nx\nget a\n",
    b"set a 0 0 1\nx\r\nget a\n",
    b"get a\r\r\n",
    b"set n 0 0 3\r\n100\r\nincr n 5\r\ndecr n 10\r\ndecr n 90\r\nget n\r\n",
    b"set n 0 0 2\r\nab\r\nincr n 1\r\n",
    b"incr nx 1\r\n",
    b"set n 0 0 2\r\n10\r\nincr n -1\r\nincr n abc\r\nincr n 18446744073709551615\r\nget n\r\n",
    b"set n 0 0 20\r\n18446744073709551615\r\nincr n 1\r\nget n\r\n",
    b"set n 0 0 3\r\n 12\r\nincr n 1\r\nget n\r\n",
    b"set n 0 0 3\r\n-12\r\nincr n 1\r\n",
    b"set n 0 0 0\r\n\r\nincr n 1\r\n",
    b"incr n 1 extra\r\nincr n 1 noreply extra\r\nincr\r\n",
    b"set a 0 0 1\r\nx\r\ndelete a 0\r\ndelete a 1\r\ndelete a noreply\r\ndelete a 0 noreply\r\ndelete a x y z\r\ndelete\r\n",
    b"set a 0 0 1\r\nx\r\ntouch a abc\r\ntouch a 10\r\ntouch a 10 noreply\r\ntouch a 10 x\r\ntouch a\r\n",
    b"set a 0 0 1\r\nx\r\ntouch a -1\r\nget a\r\n",
    b"set a 0 0 1\r\nx\r\ngets a\r\ncas a 0 0 1 999999\r\ny\r\ncas b 0 0 1 1\r\ny\r\n",
    b"cas a 0 0 1\r\ny\r\n",
    b"set a 0 0 1\r\nx\r\ncas a 0 0 1 abc\r\ny\r\n",
    b"append zz 0 0 1\r\nx\r\nprepend zz 0 0 1\r\nx\r\n",
    b"set a 5 0 1\r\nx\r\nappend a 9 0 2\r\nyz\r\nprepend a 0 0 1\r\nw\r\nget a\r\n",
    b"add a 0 0 1\r\nx\r\nadd a 0 0 1\r\ny\r\nreplace q 0 0 1\r\nz\r\nreplace a 0 0 1\r\nz\r\nget a\r\n",
    b"set a 0 0 1 noreply\r\nxyz\r\n",
    b"set n 0 0 1\r\n1\r\nincr n 1 noreply\r\nincr n x noreply\r\nget n\r\n",
    b"set a\x01b 0 0 1\r\nx\r\nget a\x01b\r\n",
    b"x" * 3000,
    b"set a 0 0 1\r\nx\r\nquit\r\nget a\r\n",
    b"verbosity 1\r\n",
    b"verbosity\r\nverbosity 1 noreply\r\nverbosity 1 2 3 4\r\n",
    b"version foo bar\r\n",
    b"set noreply 0 0 1\r\nx\r\ndelete noreply\r\ndelete noreply\r\nincr k noreply\r\n",
    b"flush_all x\r\nflush_all 10 noreply x\r\nflush_all noreply\r\nget a\r\n",
    b"set a 0 0 1\r\nx\r\nquit now\r\nget a\r\n",
    # Lengths past a C int's (less the block's \r\n): a bad line, no block.
    b"set a 0 0 2147483647\r\n",
    b"set a 0 0 2147483647\r\nxx\r\nget a\r\n",
    b"set a 0 0 2147483646\r\nget a\r\n",
    b"set a 0 0 4294967295\r\nget a\r\n",
    b"set a 0 0 2147483647 noreply\r\nget a\r\n",
    b"cas a 0 0 2147483647 1\r\nget a\r\n",
    b"append a 0 0 2147483647\r\nget a\r\n",
    # memcached 1.6's meta commands: every command, flag and error path
    # (tests/conformance.py masks CAS values; keys start with "m").
    b"ms ma 2\r\nhi\r\nmg ma v\r\nmg ma\r\nmg ma q\r\nmg ma v q\r\nmg mb q\r\nmg mb\r\nmn\r\n",
    b"ms ma 2 T100 F7\r\nhi\r\nmg ma k v c f s t h l O123\r\nmg ma h l t\r\nme ma\r\nmn\r\n",
    b"mg mzz k O1 v c f t s\r\nmd mzz k O1\r\nma mzz k O1 v\r\nms mzz 1 MR k O1 c\r\nx\r\nme mzz\r\nmn\r\n",
    b"ms ma 1 q\r\nx\r\nms ma 1 q C1\r\ny\r\nmn\r\n",
    b"md ma q\r\nmd ma q\r\nmd ma\r\nmn\r\n",
    b"ma mn q\r\nma mn N0 q\r\nma mn q\r\nma mn v\r\nma mn q v\r\nmg mn v\r\nmn\r\n",
    b"ms ms 1 MS\r\n1\r\nms ms 1 ME\r\n2\r\nms ms2 1 ME\r\n2\r\nms ms 1 MA\r\n3\r\nms ms 1 MP\r\n0\r\nmg ms v\r\nmn\r\n",
    b"ms mz 1 MA\r\n1\r\nms mz 1 MR\r\n1\r\nms mz 1 MX\r\n1\r\nms mz 1 Mx\r\n1\r\nms mz 1 M\r\n1\r\nms mz 1 Ms\r\n1\r\nmn\r\n",
    b"ms mc 1 c\r\nx\r\nms mc 1 C99999999 c k O2\r\ny\r\nms mcnope 1 C1\r\ny\r\nms mc 1 Cabc\r\ny\r\nms mc 1 C0\r\ny\r\nmn\r\n",
    b"ms md 1\r\nx\r\nmd md I T30\r\nmg md v t\r\nmg md v t\r\nmg md v\r\nms md 1\r\nz\r\nmg md v\r\nmn\r\n",
    b"mg mw N30 v t\r\nmg mw N30 v t\r\nmg mw v\r\nms mw 1\r\nq\r\nmg mw v R30 t\r\nmg mw v t N30\r\nmn\r\n",
    b"ms mr 1 T20\r\nx\r\nmg mr R10 t\r\nmg mr R30 t v\r\nmg mr R30 t\r\nmn\r\n",
    b"mg mviv t N30\r\nmg mviv2 N30 q\r\nmg mviv3 N-1\r\nmn\r\n",
    b"ma mx N0 J10 v\r\nma mx v D5\r\nma mx v MD D100\r\nma mx v M- D1\r\nma mx v M+\r\nma mx v Mq\r\nma mx v t\r\nma mx T100 t v\r\nma mx t T10\r\nmg mx t v\r\nmn\r\n",
    b"ma mx Dabc\r\nma mx D-1\r\nms my 1\r\nq\r\nma my\r\nma mx k O5 v\r\nma mx C0 v\r\nmn\r\n",
    b"ma mbig N0 J18446744073709551615 v\r\nma mbig v\r\nma mbig q\r\nmg mbig v\r\nma mt4 N100 J7 D5 MD v\r\nma mt5 J99 v\r\nma mt6 N0 q O1\r\nmn\r\n",
    b"ms mpad 2\r\n10\r\nma mpad MD v\r\nmg mpad v\r\nmn\r\n",
    b"mg\r\nms\r\nms ma\r\nms ma x\r\nms ma -1\r\nms ma 1 Z\r\nx\r\nmd\r\nma\r\nme\r\nmn a b\r\nmn\r\n",
    b"mg ma zz\r\nmg ma vv\r\nmg ma O\r\nmg ma T\r\nmg ma Tx\r\nmg ma O" + b"o" * 40 + b"\r\nmg ma v v\r\nmg ma v k k\r\nmn\r\n",
    b"mg ma x\r\nmg ma F5\r\nmg ma I\r\nmg ma C5\r\nmg ma M\r\nmg ma D\r\nmg ma J\r\nmg ma E5\r\nmg ma S5\r\nmg ma 1\r\nmg ma P L\r\nmn\r\n",
    b"mg ma Jx Dx\r\nmg ma Dx Jx\r\nmg ma Dx v v\r\nmg ma noreply\r\nmg ma Fabc\r\nmg ma F-1\r\nmn\r\n",
    b"ms ma 1 T\r\nx\r\nms ma 1 Fabc\r\nx\r\nms ma 1 F-1\r\nx\r\nms ma 1 v t h s N5\r\nx\r\nms ma 1 MAN5\r\nx\r\nms ma 1 noreply\r\nx\r\nmn\r\n",
    b"ms ma 1 O" + b"o" * 40 + b"\r\nx\r\nms ma 1 Mx O" + b"o" * 40 + b"\r\nx\r\nmn\r\n",
    b"md ma v\r\nmd ma t\r\nmd ma C\r\nmd ma x\r\nmd ma q q\r\nma ma v v\r\nma ma N\r\nma ma Jx\r\nma ma f\r\nmn\r\n",
    b"ms ma 1\r\nxy\r\nmg ma v\r\nmn\r\n",
    b"mg " + b"k" * 251 + b" v\r\nms " + b"k" * 251 + b" 1\r\nx\r\nmd " + b"k" * 251 + b"\r\nme " + b"k" * 251 + b"\r\nmn\r\n",
    b"ms " + b"k" * 250 + b" 1\r\nx\r\nmg " + b"k" * 250 + b" v k\r\nmn\r\n",
    b"mg ma " + b" ".join([b"O", b"k"] + [b"P%d" % i for i in range(20)]) + b"\r\nmd ma " + b"L " * 20 + b"\r\nmn\r\n",
    # base64 keys: stored binary, shown in base64; invalid encodings.
    b"ms Zm9vYg== 3 b\r\nbar\r\nmg Zm9vYg== b k v\r\nmg foob k v\r\nme Zm9vYg== b\r\nme foob\r\nmn\r\n",
    b"ms ma 2\r\nhi\r\nmg YQ== b k v\r\nme YQ== b\r\nmg !!! b v\r\nmg Y b\r\nmg YWJj= b\r\nme ma b\r\nmd bWlzcw== b k\r\nma bWlzcw== b k\r\nmn\r\n",
    b"ms Zm9v!Yg== 1 b k\r\nx\r\nmg Zm9vYh== b k v\r\nmn\r\n",
    b"ms mbig 2000000\r\n" + big(2000000) + b"\r\nmg mbig v\r\nmn\r\n",
    b"ms mbig2 1\r\nx\r\nms mbig2 2000000 MA\r\n" + big(2000000) + b"\r\nmg mbig2 v\r\nmn\r\n",
    b"mn\r\nmn foo bar\r\nMN\r\nmx\r\n",
    # gat/gats, flush_all with a delay, cache_memlimit, HTTP, stats.
    b"set ga 0 0 1\r\nx\r\ngat 100 ga\r\ngats 100 ga nope\r\ngat\r\ngat 10\r\ngat x ga\r\nmg ga t\r\ngat -1 ga\r\nget ga\r\n",
    b"set fl 0 0 1\r\nx\r\nflush_all -1\r\nget fl\r\nset fl 0 0 1\r\nx\r\nflush_all 0\r\nget fl\r\n",
    b"cache_memlimit 100\r\ncache_memlimit\r\ncache_memlimit x\r\ncache_memlimit 0\r\ncache_memlimit 100 noreply\r\ncache_memlimit 1\r\ncache_memlimit 2000000000\r\ncache_memlimit 64\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"mn\r\nPOST /foo HTTP/1.0\r\nmn\r\n",
    b"get / HTTP/1.1\r\nGET / http/1.1\r\n",
    b"stats sizes\r\nstats cachedump\r\nstats cachedump x 1\r\nstats cachedump 64 1\r\nstats cachedump 63 1\r\n",
    b"stats detail on\r\nstats detail off\r\nstats detail dump\r\nstats detail\r\nstats detail x\r\nstats foo\r\nstats reset\r\n",
    b"set a\x00junk 0 0 1\r\nx\r\nget a\r\n",
    # The binary protocol (first byte 0x80) is off, as in a memcached run
    # with `-B ascii` (the reference is): its bytes are read as text lines
    # up to their first NUL.
    binary(0x0A, 7),
    binary(0x07, 7) + binary(0x0A, 8),
    binary(0x00, 7),
    binary(0x00, 7) + b"\r\nversion\r\n",
    binary(0x0A, 7) + b"\x42" + b"\0" * 23,
]


def raw_cases(proxy, mc):
    bad = 0
    for case in RAW_CASES:
        wait = 1.0 if len(case) > 100000 else 0.25
        a, b = raw(proxy, case, wait), raw(mc, case, wait)
        # Each case starts from the state the previous ones left; both
        # servers saw the same, so the answers must agree.
        if mask(a) != mask(b):
            bad += 1
            print(f"DIFF raw {case[:80]!r}\n  proxy:     {a[:300]!r}\n  memcached: {b[:300]!r}")
    return bad


def client_cases(proxy, mc):
    """The command set through pymemcache; returns how many differ."""
    results = []
    for server in (proxy, mc):
        c = Client(server, connect_timeout=2, timeout=5, default_noreply=False)
        r = []
        k = "conf:"
        r.append(c.set(k + "a", b"1"))
        r.append(c.set(k + "nr", b"x", noreply=True))
        r.append(c.get(k + "nr"))
        r.append(c.add(k + "a", b"2", noreply=False))
        r.append(c.add(k + "b", b"2", noreply=False))
        r.append(c.replace(k + "zz", b"3", noreply=False))
        r.append(c.replace(k + "b", b"3", noreply=False))
        r.append(c.append(k + "b", b"4", noreply=False))
        r.append(c.prepend(k + "b", b"0", noreply=False))
        r.append(c.get(k + "b"))
        r.append(sorted(c.get_many([k + "a", k + "b", k + "missing", k + "nr"]).items()))
        v, cas = c.gets(k + "b")
        r.append(v)
        r.append(c.cas(k + "b", b"new", cas, noreply=False))
        r.append(c.cas(k + "b", b"newer", cas, noreply=False))
        r.append(c.cas(k + "missing", b"x", b"1", noreply=False))
        r.append(c.get(k + "b"))
        r.append(sorted((kk, vv[0]) for kk, vv in c.gets_many([k + "a", k + "b"]).items()))
        r.append(c.set(k + "n", b"41"))
        r.append(c.incr(k + "n", 1))
        r.append(c.incr(k + "n", 10, noreply=True))
        r.append(c.decr(k + "n", 100))
        r.append(c.incr(k + "missing", 1))
        r.append(c.get(k + "n"))
        r.append(c.touch(k + "a", 100, noreply=False))
        r.append(c.touch(k + "missing", 100, noreply=False))
        r.append(c.delete(k + "a", noreply=False))
        r.append(c.delete(k + "a", noreply=False))
        r.append(c.delete(k + "b", noreply=True))
        r.append(c.get(k + "b"))
        r.append(c.set(k + "exp", b"x", expire=1))
        r.append(c.get(k + "exp"))
        for i in range(50):
            c.set(f"{k}many{i}", str(i).encode() * (i + 1), noreply=True)
        got = c.get_many([f"{k}many{i}" for i in range(50)])
        r.append(sorted(got.items()))
        try:
            c.incr(k + "a2", 1)
            r.append("no error")
        except Exception as e:  # noqa: BLE001 - record whatever the client says
            r.append(type(e).__name__)
        c.set(k + "str", b"abc")
        try:
            c.incr(k + "str", 1)
            r.append("no error")
        except Exception as e:  # noqa: BLE001
            r.append((type(e).__name__, str(e)))
        version = c.version()
        stats = c.stats()
        r.append(bool(re.match(rb"^\d+\.\d+\.\d+", version)))
        r.append(all(x in stats for x in (b"pid", b"uptime", b"curr_connections", b"get_hits")))
        c.close()
        results.append(r)
    time.sleep(1.2)
    bad = 0
    for i, (a, b) in enumerate(zip(*results)):
        if a != b:
            bad += 1
            print(f"DIFF client step {i}:\n  proxy:     {a!r}\n  memcached: {b!r}")
    return bad


def stats_shapes(proxy, mc):
    """The stats subcommands whose values are the proxy's own: the same
    shape as memcached's (names it answers are names memcached has)."""
    bad = 0
    p, m = Client(proxy), Client(mc)
    ours, theirs = p.stats("settings"), m.stats("settings")
    extra = sorted(k for k in ours if k not in theirs)
    if not ours or extra:
        bad += 1
        print(f"DIFF stats settings: names memcached does not have: {extra!r} (of {sorted(ours)!r})")
    for sub, need in (("slabs", [b"active_slabs", b"total_malloced"]), ("items", [])):
        got = p.stats(sub)
        if any(k not in got for k in need) or any(k not in m.stats(sub) and not k.startswith(b"items:") for k in got):
            bad += 1
            print(f"DIFF stats {sub}: {got!r}")
    p.close()
    m.close()
    return bad


def main():
    proxy, mc = addr(sys.argv[1]), addr(sys.argv[2])
    bad = raw_cases(proxy, mc)
    bad += client_cases(proxy, mc)
    bad += stats_shapes(proxy, mc)
    print(f"conformance: {len(RAW_CASES)} raw cases and the pymemcache command set; {bad} differences")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
