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
    try:
        while True:
            b = s.recv(1 << 20)
            if not b:
                out += b"<closed>"
                break
            out += b
    except socket.timeout:
        pass
    s.close()
    return out


CAS = re.compile(rb"^(VALUE \S+ \d+ \d+) \d+\r$", re.M)


VERSION = re.compile(rb"^VERSION \S+\r$", re.M)


def mask(b):
    """CAS uniques and the version string differ by design."""
    return VERSION.sub(b"VERSION <v>\r", CAS.sub(rb"\1 <cas>\r", b))


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
    # The binary protocol (first byte 0x80): what memcached answers without
    # an item — NOOP, QUIT, an unknown opcode, a wrong magic closing.
    binary(0x0A, 7),
    binary(0x07, 7) + binary(0x0A, 8),
    binary(0x50, 7),
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


def main():
    proxy, mc = addr(sys.argv[1]), addr(sys.argv[2])
    bad = raw_cases(proxy, mc)
    bad += client_cases(proxy, mc)
    print(f"conformance: {len(RAW_CASES)} raw cases and the pymemcache command set; {bad} differences")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
