//! Sharded tables of string keys, each key's hashes computed once per lookup: what the
//! embedded store keeps its state in and the deny cache its refusals.
//!
//! A key's keyed hash (SipHash with a per-table random key, so clients cannot aim keys at one
//! slot) picks its shard from bits 32 and up, its slot in the shard's table from the low bits
//! and hashbrown's control tag from the top bits, so the keys of one shard still spread over
//! its table. Each shard is a `parking_lot::Mutex`: cores deciding different keys rarely meet
//! on a lock.
//!
//! A table holds a key as 128 bits, that hash and a second keyed hash of it, not as its
//! text: a lookup then reads the slot and nothing else (comparing the text was a third cache
//! miss, on the key's own heap bytes), and a key costs 16 bytes instead of a 24-byte string
//! and its allocation (about 70 bytes less per key). Two keys are confused only if both
//! hashes agree, a chance of about 2⁻¹²⁸ per pair under keys a client never sees: far below
//! a flipped bit in memory.
use hashbrown::HashTable;
use parking_lot::Mutex;
use std::hash::{BuildHasher, RandomState};

/// A key's two keyed hashes, computed once per call: 128 bits that stand for the key.
#[derive(Clone, Copy)]
pub struct Hashed {
    hash: u64,
    check: u64,
}

/// One shard's keys: `(hash, check, value)` found by the key's hash and told apart by both.
pub struct Table<V>(HashTable<(u64, u64, V)>);

impl<V> Default for Table<V> {
    fn default() -> Self {
        Table(HashTable::new())
    }
}

impl<V> Table<V> {
    pub fn get(&self, k: Hashed) -> Option<&V> {
        self.0.find(k.hash, |e| is(e, k)).map(|(_, _, v)| v)
    }

    pub fn get_mut(&mut self, k: Hashed) -> Option<&mut V> {
        self.0.find_mut(k.hash, |e| is(e, k)).map(|(_, _, v)| v)
    }

    /// Whether the key was there.
    pub fn remove(&mut self, k: Hashed) -> bool {
        match self.0.find_entry(k.hash, |e| is(e, k)) {
            Ok(slot) => {
                slot.remove();
                true
            }
            Err(_) => false,
        }
    }

    /// Insert a key that is not in the table (its hash is kept: growing rehashes nothing).
    pub fn insert_new(&mut self, k: Hashed, value: V) {
        self.0
            .insert_unique(k.hash, (k.hash, k.check, value), |(h, _, _)| *h);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&V) -> bool) {
        self.0.retain(|(_, _, v)| keep(v));
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.0.iter().map(|(_, _, v)| v)
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }
}

/// What sets a key's check input apart from its hash input.
const CHECK: u8 = 0x7a;

fn is<V>((hash, check, _): &(u64, u64, V), k: Hashed) -> bool {
    *hash == k.hash && *check == k.check
}

/// `n` shards of [`Table`]s under their own locks, and the hasher that places keys in them.
pub struct Shards<V> {
    shards: Box<[Mutex<Table<V>>]>,
    hasher: RandomState,
}

impl<V> Shards<V> {
    pub fn new(n: usize) -> Self {
        Shards {
            shards: (0..n.max(1)).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
        }
    }

    /// The one way a key is hashed. The check is the same keyed hash of the key with one
    /// more byte: another input, so another independent 64 bits.
    pub fn hashed(&self, key: &str) -> Hashed {
        Hashed {
            hash: self.hasher.hash_one(key),
            check: self.hasher.hash_one((key, CHECK)),
        }
    }

    /// The index of `k`'s shard (requests touching several take their locks in this order).
    pub fn index_of(&self, k: Hashed) -> usize {
        ((k.hash >> 32) % self.shards.len() as u64) as usize
    }

    pub fn at(&self, index: usize) -> &Mutex<Table<V>> {
        &self.shards[index]
    }

    /// `k`'s shard.
    pub fn of(&self, k: Hashed) -> &Mutex<Table<V>> {
        self.at(self.index_of(k))
    }

    pub fn len(&self) -> usize {
        self.shards.len()
    }

    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Mutex<Table<V>>> {
        self.shards.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_found_by_its_hash_and_its_check() {
        let s: Shards<u32> = Shards::new(4);
        let (a, b) = (s.hashed("a"), s.hashed("b"));
        // Two independent halves: the check is not the hash again.
        assert_ne!(a.hash, a.check);
        assert_eq!((a.hash, a.check), (s.hashed("a").hash, s.hashed("a").check));
        s.of(a).lock().insert_new(a, 1);
        assert_eq!(s.of(a).lock().get(a), Some(&1));
        assert_eq!(s.of(b).lock().get(b), None);
        // The same hash with another check is another key.
        let forged = Hashed {
            check: b.check,
            ..a
        };
        assert_eq!(s.of(a).lock().get(forged), None);
        *s.of(a).lock().get_mut(a).unwrap() = 2;
        assert_eq!(s.of(a).lock().get(a), Some(&2));
        assert!(s.of(a).lock().remove(a));
        assert!(!s.of(a).lock().remove(a));
        assert!(s.of(a).lock().is_empty());
    }

    #[test]
    fn keys_spread_over_the_shards_and_survive_growth() {
        let s: Shards<usize> = Shards::new(8);
        let keys: Vec<String> = (0..4000).map(|i| format!("sluice:r:l:{i}")).collect();
        for (i, key) in keys.iter().enumerate() {
            let k = s.hashed(key);
            s.of(k).lock().insert_new(k, i);
        }
        for (i, key) in keys.iter().enumerate() {
            let k = s.hashed(key);
            assert_eq!(s.of(k).lock().get(k), Some(&i), "{key}");
        }
        // 4000 keys over 8 shards: about 500 each; a shard-picking bug puts them in one.
        for shard in s.iter() {
            let n = shard.lock().len();
            assert!((300..700).contains(&n), "{n} keys in one shard");
        }
    }
}
