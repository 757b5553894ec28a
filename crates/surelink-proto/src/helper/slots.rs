//! The table of virtual connections one helper opened at a server: which
//! slots are open, what the shell keeps for each, and the bounds that stop
//! a helper (or whoever holds its key) from making the server hold more.
//!
//! The server applies every record a helper sends through this table
//! before it touches a connection: an OPEN of a slot already open, a DATA
//! or CLOSE for a slot never opened, or an OPEN past [`SlotTable::max`]
//! are refused with a typed [`SlotError`] (the shell then closes that
//! slot, or the helper's relay when the record makes no sense at all).
//! Per-slot bytes in flight are bounded by the shell's queues; the number
//! of slots is bounded here.

use rustc_hash::FxHashMap;

use super::record::Record;

/// Virtual connections one helper may hold open at a server by default:
/// PostMan's helpers carried ~1 000 clients each (L230–239).
pub const DEFAULT_MAX_SLOTS: usize = 4096;

/// Why a record was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SlotError {
    /// An OPEN for a slot that is open already.
    #[error("slot {0} is open already")]
    AlreadyOpen(u32),
    /// A DATA or CLOSE for a slot that is not open (a CLOSE may cross one
    /// of ours: the shell ignores it quietly).
    #[error("slot {0} is not open")]
    NotOpen(u32),
    /// An OPEN past the table's bound.
    #[error("the helper holds {max} slots open, the most it may")]
    Full {
        /// The bound.
        max: usize,
    },
}

/// What applying one record asks the shell to do.
#[derive(Debug, PartialEq, Eq)]
pub enum SlotAction<'a, T> {
    /// A slot opened: the shell's value for it was stored.
    Opened,
    /// Bytes for the slot's connection.
    Data(&'a T),
    /// The slot closed: here is what the shell kept for it.
    Closed(T),
}

/// One helper's open slots at a server, each with the shell's value `T`
/// (its end of the virtual connection).
#[derive(Debug)]
pub struct SlotTable<T> {
    slots: FxHashMap<u32, T>,
    max: usize,
}

impl<T> SlotTable<T> {
    /// An empty table holding at most `max` slots.
    pub fn new(max: usize) -> Self {
        SlotTable {
            slots: FxHashMap::default(),
            max,
        }
    }

    /// The bound on open slots.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Slots open.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// No slot is open.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Applies `record`; `open` makes the shell's value for a new slot
    /// (called only when the OPEN is accepted).
    pub fn apply(
        &mut self,
        record: &Record,
        open: impl FnOnce(u32) -> T,
    ) -> Result<SlotAction<'_, T>, SlotError> {
        match record {
            Record::Open { slot } => {
                if self.slots.contains_key(slot) {
                    return Err(SlotError::AlreadyOpen(*slot));
                }
                if self.slots.len() >= self.max {
                    return Err(SlotError::Full { max: self.max });
                }
                self.slots.insert(*slot, open(*slot));
                Ok(SlotAction::Opened)
            }
            Record::Data { slot, .. } => self
                .slots
                .get(slot)
                .map(SlotAction::Data)
                .ok_or(SlotError::NotOpen(*slot)),
            Record::Close { slot, .. } => self
                .slots
                .remove(slot)
                .map(SlotAction::Closed)
                .ok_or(SlotError::NotOpen(*slot)),
        }
    }

    /// Forgets `slot` (our side closed it); its value, if it was open.
    pub fn remove(&mut self, slot: u32) -> Option<T> {
        self.slots.remove(&slot)
    }

    /// Empties the table (the helper's relay ended): every value.
    pub fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.slots.drain().map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn data(slot: u32) -> Record {
        Record::Data {
            slot,
            body: Bytes::from_static(b"x"),
        }
    }

    #[test]
    fn a_slot_opens_carries_data_and_closes_once() {
        let mut t = SlotTable::new(4);
        assert_eq!(
            t.apply(&Record::Open { slot: 7 }, |s| s * 10),
            Ok(SlotAction::Opened)
        );
        assert_eq!(
            t.apply(&data(7), |_| unreachable!()),
            Ok(SlotAction::Data(&70))
        );
        assert_eq!(
            t.apply(&Record::Close { slot: 7, code: 0 }, |_| unreachable!()),
            Ok(SlotAction::Closed(70))
        );
        assert_eq!(t.apply(&data(7), |_| 0), Err(SlotError::NotOpen(7)));
        assert_eq!(
            t.apply(&Record::Close { slot: 7, code: 0 }, |_| 0),
            Err(SlotError::NotOpen(7))
        );
        assert!(t.is_empty());
    }

    #[test]
    fn a_second_open_of_a_slot_is_refused_and_keeps_the_first() {
        let mut t = SlotTable::new(4);
        t.apply(&Record::Open { slot: 1 }, |_| "first").unwrap();
        assert_eq!(
            t.apply(&Record::Open { slot: 1 }, |_| "second"),
            Err(SlotError::AlreadyOpen(1))
        );
        assert_eq!(t.apply(&data(1), |_| ""), Ok(SlotAction::Data(&"first")));
    }

    #[test]
    fn opens_past_the_bound_are_refused_until_one_closes() {
        let mut t = SlotTable::new(2);
        t.apply(&Record::Open { slot: 1 }, |s| s).unwrap();
        t.apply(&Record::Open { slot: 2 }, |s| s).unwrap();
        assert_eq!(
            t.apply(&Record::Open { slot: 3 }, |s| s),
            Err(SlotError::Full { max: 2 })
        );
        assert_eq!(t.remove(1), Some(1));
        assert_eq!(
            t.apply(&Record::Open { slot: 3 }, |s| s),
            Ok(SlotAction::Opened)
        );
        let mut left: Vec<u32> = t.drain().collect();
        left.sort_unstable();
        assert_eq!(left, vec![2, 3]);
        assert!(t.is_empty());
    }
}
