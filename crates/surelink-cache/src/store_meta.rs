//! The meta commands on the embedded store, with memcached 1.6.18's
//! answers: return flags in the order asked (`T` and `N` take effect
//! where they stand among them), then `Z` (someone already won the
//! recache), `X` (stale), `W` (this client won it). Quiet mode is applied
//! here: a suppressed answer is no bytes at all.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};

use crate::store::{expiry, Item, Store, BINARY, FETCHED, STALE, TOKEN_SENT};
use crate::text::meta::{Meta, MetaOp, SetMode};
use crate::text::strtoull;

/// What the return flags may show of the item.
struct View<'a> {
    /// The store's key and whether it is shown in base64.
    key: &'a [u8],
    binary: bool,
    item: Option<&'a Item>,
    /// The exptime as the flags read so far left it.
    expires: i64,
    /// Fetched and last access before this command (`h`, `l`).
    fetched: bool,
    accessed: i64,
    /// `ma`'s new number (the item's value may be padded).
    number: Option<&'a [u8]>,
}

impl<'a> View<'a> {
    /// The request's own key, no item (a failure's, or before the item).
    fn request(m: &'a Meta, now: i64) -> View<'a> {
        View {
            key: &m.key,
            binary: m.opts.base64,
            item: None,
            expires: 0,
            fetched: false,
            accessed: now,
            number: None,
        }
    }
}

impl Store {
    /// Runs a meta command at `now`, appending memcached's answer (nothing
    /// when quiet mode hides it).
    pub fn meta(&self, m: &Meta, now: i64, out: &mut BytesMut) {
        match m.op {
            MetaOp::Get => self.meta_get(m, now, out),
            MetaOp::Set => self.meta_set(m, now, out),
            MetaOp::Delete => self.meta_delete(m, now, out),
            MetaOp::Arith => self.meta_arith(m, now, out),
            MetaOp::Debug => self.meta_debug(m, now, out),
        }
    }

    fn meta_get(&self, m: &Meta, now: i64, out: &mut BytesMut) {
        let o = &m.opts;
        let _g = self.lock(&m.key);
        let (item, created) = match self.live(&m.key, now) {
            Some(i) => (i, false),
            None if o.vivify.is_some() => {
                // A stub the winner fills; later readers see `Z`.
                let stub = Item::new(0, 0, self.cas_id(), Bytes::new(), now);
                stub.set_bits(TOKEN_SENT | if o.base64 { BINARY } else { 0 });
                (Arc::new(stub), true)
            }
            None => {
                self.count_get(false);
                if !o.quiet {
                    out.put_slice(b"EN");
                    echo(m, out);
                    out.put_slice(b"\r\n");
                }
                return;
            }
        };
        self.count_get(!created);
        let bits = if created { 0 } else { item.bits() };
        let mut v = View {
            key: &m.key,
            binary: item.bits() & BINARY != 0,
            item: Some(&item),
            expires: item.expires,
            fetched: bits & FETCHED != 0,
            accessed: item.accessed(),
            number: None,
        };
        head(o.value, item.data.len(), out);
        flags(m, &mut v, now, created, out);
        let (sent, stale) = (bits & TOKEN_SENT != 0, bits & STALE != 0);
        let short = o
            .recache
            .is_some_and(|r| v.expires != 0 && v.expires - now < i64::from(r));
        let won = created || (!sent && (stale || short));
        if sent {
            out.put_slice(b" Z");
        }
        if stale {
            out.put_slice(b" X");
        }
        if won {
            out.put_slice(b" W");
        }
        out.put_slice(b"\r\n");
        if o.value {
            out.put_slice(&item.data);
            out.put_slice(b"\r\n");
        }
        let expires = v.expires;
        if created || expires != item.expires {
            let i = item.copy();
            let mut i = i;
            i.expires = expires;
            let i = Arc::new(i);
            if won {
                i.set_bits(TOKEN_SENT);
            }
            self.put_arc(&m.key, i.clone());
            if !o.no_bump && !created {
                i.touch_read(now);
            }
        } else {
            if won {
                item.set_bits(TOKEN_SENT);
            }
            if !o.no_bump {
                item.touch_read(now);
            }
        }
    }

    fn meta_set(&self, m: &Meta, now: i64, out: &mut BytesMut) {
        let o = &m.opts;
        self.count_set();
        let _g = self.lock(&m.key);
        let old = self.live(&m.key, now);
        let cas_mode = o.compare_cas.is_some() && matches!(o.mode, SetMode::Set | SetMode::Replace);
        let mut stale = false;
        let refused = match (o.mode, &old) {
            (SetMode::Add, Some(_)) => Some("NS"),
            (SetMode::Append | SetMode::Prepend | SetMode::Replace, None) if !cas_mode => {
                Some("NS")
            }
            (_, None) if cas_mode => Some("NF"),
            (SetMode::Append | SetMode::Prepend, Some(i)) => o
                .compare_cas
                .filter(|&c| c != 0 && c != i.cas)
                .map(|_| "EX"),
            (_, Some(i)) if cas_mode => {
                let c = o.compare_cas.unwrap_or(0);
                if c == i.cas {
                    None
                } else if o.invalidate && c < i.cas {
                    stale = true;
                    None
                } else {
                    Some("EX")
                }
            }
            _ => None,
        };
        let mut v = View::request(m, now);
        if let Some(code) = refused {
            out.put_slice(code.as_bytes());
            flags(m, &mut v, now, false, out);
            return out.put_slice(b"\r\n");
        }
        let item = match (o.mode, &old) {
            (SetMode::Append | SetMode::Prepend, Some(old)) => {
                let mut joined = BytesMut::with_capacity(old.data.len() + m.data.len());
                if o.mode == SetMode::Append {
                    joined.put_slice(&old.data);
                    joined.put_slice(&m.data);
                } else {
                    joined.put_slice(&m.data);
                    joined.put_slice(&old.data);
                }
                Item::new(old.flags, old.expires, self.cas_id(), joined.freeze(), now)
            }
            // An invalidating set keeps the old exptime and winner, stale.
            (_, Some(old)) if stale => {
                let i = Item::new(
                    o.client_flags.unwrap_or(0),
                    old.expires,
                    self.cas_id(),
                    m.data.clone(),
                    now,
                );
                i.set_bits(STALE | (old.bits() & TOKEN_SENT));
                i
            }
            _ => Item::new(
                o.client_flags.unwrap_or(0),
                expiry(o.ttl.unwrap_or(0), now),
                self.cas_id(),
                m.data.clone(),
                now,
            ),
        };
        if o.base64 {
            item.set_bits(BINARY);
        }
        let item = Arc::new(item);
        self.put_arc(&m.key, item.clone());
        if o.quiet {
            return;
        }
        v.item = Some(&item);
        out.put_slice(b"HD");
        flags(m, &mut v, now, false, out);
        out.put_slice(b"\r\n");
    }

    fn meta_delete(&self, m: &Meta, now: i64, out: &mut BytesMut) {
        let o = &m.opts;
        let _g = self.lock(&m.key);
        let mut v = View::request(m, now);
        let code = match self.live(&m.key, now) {
            None => "NF",
            Some(old) if o.compare_cas.is_some_and(|c| c != old.cas) => "EX",
            Some(old) => {
                if o.invalidate {
                    let mut i = Item::new(
                        old.flags,
                        old.expires,
                        self.cas_id(),
                        old.data.clone(),
                        old.accessed(),
                    );
                    if let Some(t) = o.ttl {
                        i.expires = expiry(t, now);
                    }
                    i.set_bits(STALE | (old.bits() & !TOKEN_SENT));
                    self.put(&m.key, i);
                } else {
                    self.remove(&m.key);
                }
                if o.quiet {
                    return;
                }
                "HD"
            }
        };
        out.put_slice(code.as_bytes());
        flags(m, &mut v, now, false, out);
        out.put_slice(b"\r\n");
    }

    fn meta_arith(&self, m: &Meta, now: i64, out: &mut BytesMut) {
        let o = &m.opts;
        let _g = self.lock(&m.key);
        let mut v = View::request(m, now);
        let (item, number, created) = match self.live(&m.key, now) {
            None if o.vivify.is_some() => {
                let text = o.initial.to_string();
                let i = Item::new(0, 0, self.cas_id(), Bytes::from(text.clone()), now);
                (i, text, true)
            }
            None => {
                out.put_slice(b"NF");
                echo(m, out);
                return out.put_slice(b"\r\n");
            }
            Some(old) => {
                if o.compare_cas.is_some_and(|c| c != 0 && c != old.cas) {
                    out.put_slice(b"EX");
                    echo(m, out);
                    return out.put_slice(b"\r\n");
                }
                let mut with_crlf = old.data.to_vec();
                with_crlf.extend_from_slice(b"\r\n");
                let value = match strtoull(&with_crlf) {
                    Some(v) if !old.data.is_empty() => v,
                    _ => {
                        return out.put_slice(
                            b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
                        )
                    }
                };
                let n = if o.decr {
                    value.saturating_sub(o.delta)
                } else {
                    value.wrapping_add(o.delta)
                };
                let text = n.to_string();
                // In place, padded with spaces, when it fits (memcached).
                let mut data = text.clone().into_bytes();
                if data.len() < old.data.len() {
                    data.resize(old.data.len(), b' ');
                }
                let i = Item::new(
                    old.flags,
                    old.expires,
                    self.cas_id(),
                    Bytes::from(data),
                    now,
                );
                i.set_bits(old.bits());
                (i, text, false)
            }
        };
        v.expires = item.expires;
        v.item = Some(&item);
        v.number = Some(number.as_bytes());
        let mut line = BytesMut::new();
        head(o.value, number.len(), &mut line);
        flags(m, &mut v, now, created, &mut line);
        let expires = v.expires;
        let mut item = item;
        item.expires = expires;
        self.put(&m.key, item);
        // Quiet hides a change's answer, not a creation's.
        if o.quiet && !created {
            return;
        }
        out.put_slice(&line);
        out.put_slice(b"\r\n");
        if o.value {
            out.put_slice(number.as_bytes());
            out.put_slice(b"\r\n");
        }
    }

    fn meta_debug(&self, m: &Meta, now: i64, out: &mut BytesMut) {
        let Some(i) = self.live(&m.key, now) else {
            return out.put_slice(b"EN\r\n");
        };
        // memcached prints the expiry as now less the expiry time, its
        // slab class and its item size (ours: one class; key, value and
        // our per-item cost).
        let exp = if i.expires == 0 { -1 } else { now - i.expires };
        let fetched = if i.bits() & FETCHED != 0 { "yes" } else { "no" };
        out.put_slice(b"ME ");
        put_key(&m.key, i.bits() & BINARY != 0, false, out);
        out.put_slice(
            format!(
                " exp={exp} la={} cas={} fetch={fetched} cls=1 size={}\r\n",
                now - i.accessed(),
                i.cas,
                m.key.len() as u64 + i.data.len() as u64 + crate::store::ITEM_COST,
            )
            .as_bytes(),
        );
    }
}

/// `VA <len>` or `HD`.
fn head(value: bool, len: usize, out: &mut BytesMut) {
    if value {
        out.put_slice(b"VA ");
        out.put_slice(itoa::Buffer::new().format(len).as_bytes());
    } else {
        out.put_slice(b"HD");
    }
}

/// A miss's flags: only `O` and `k` come back.
fn echo(m: &Meta, out: &mut BytesMut) {
    for x in &m.flags {
        match x.flag {
            b'O' => {
                out.put_slice(b" O");
                out.put_slice(&x.token);
            }
            b'k' => {
                out.put_slice(b" k");
                put_key(&m.key, m.opts.base64, true, out);
            }
            _ => {}
        }
    }
}

/// A key as memcached shows it: base64 for a binary one (with ` b` after
/// a `k` flag's).
fn put_key(key: &[u8], binary: bool, mark: bool, out: &mut BytesMut) {
    if binary {
        out.put_slice(crate::text::meta_key(key).as_bytes());
        if mark {
            out.put_slice(b" b");
        }
    } else {
        out.put_slice(key);
    }
}

/// The return flags, in the order the client gave them; `T` and `N`
/// change the exptime where they stand (a `t` before them shows the old).
fn flags(m: &Meta, v: &mut View<'_>, now: i64, created: bool, out: &mut BytesMut) {
    let mut n = itoa::Buffer::new();
    let op = m.op;
    for x in &m.flags {
        match (x.flag, v.item) {
            (b'O', _) => {
                out.put_slice(b" O");
                out.put_slice(&x.token);
            }
            (b'k', _) => {
                out.put_slice(b" k");
                put_key(v.key, v.binary, true, out);
            }
            (b'c', i) if op != MetaOp::Delete => {
                out.put_slice(b" c");
                out.put_slice(n.format(i.map_or(0, |i| i.cas)).as_bytes());
            }
            (b'T', Some(_)) if matches!(op, MetaOp::Get | MetaOp::Arith) => {
                if let Some(t) = m.opts.ttl {
                    v.expires = expiry(t, now);
                }
            }
            (b'N', Some(_)) if created => {
                if let Some(t) = m.opts.vivify {
                    v.expires = expiry(t, now);
                }
            }
            (b't', Some(_)) if matches!(op, MetaOp::Get | MetaOp::Arith) => {
                out.put_slice(b" t");
                if v.expires == 0 {
                    out.put_slice(b"-1");
                } else {
                    // memcached prints it unsigned: a past time wraps.
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    let left = (v.expires - now) as u32;
                    out.put_slice(n.format(left).as_bytes());
                }
            }
            (b'f', Some(i)) if op == MetaOp::Get => {
                out.put_slice(b" f");
                out.put_slice(n.format(i.flags).as_bytes());
            }
            (b's', Some(i)) if op == MetaOp::Get => {
                out.put_slice(b" s");
                out.put_slice(
                    n.format(v.number.map_or(i.data.len(), <[u8]>::len))
                        .as_bytes(),
                );
            }
            (b'h', Some(_)) if op == MetaOp::Get => {
                out.put_slice(if v.fetched { b" h1" } else { b" h0" });
            }
            (b'l', Some(_)) if op == MetaOp::Get => {
                out.put_slice(b" l");
                out.put_slice(n.format(now - v.accessed).as_bytes());
            }
            _ => {}
        }
    }
}

#[cfg(test)]
#[path = "store_meta_tests.rs"]
mod tests;
