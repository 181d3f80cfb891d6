//! A ring buffer of keys and values holding at most `capacity` positions (the attention
//! window, current position included). Memory is bounded by `capacity` whatever the session
//! length; storage grows lazily up to that bound.

/// Keys and values of one attention layer, `width = heads * head_dim` floats per position.
#[derive(Clone, Debug)]
pub struct KvCache {
    capacity: usize,
    width: usize,
    keys: Vec<f32>,
    values: Vec<f32>,
    /// Slot written by the next `push` once the ring is full.
    next_slot: usize,
    /// Positions pushed since the last reset.
    pushed: usize,
}

impl KvCache {
    pub fn new(capacity: usize, width: usize) -> Self {
        assert!(
            capacity > 0,
            "a KV cache needs room for at least the current position"
        );
        Self {
            capacity,
            width,
            keys: Vec::new(),
            values: Vec::new(),
            next_slot: 0,
            pushed: 0,
        }
    }

    /// Maximum number of positions kept.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Positions currently held (`min(pushed, capacity)`).
    pub fn len(&self) -> usize {
        self.keys.len() / self.width.max(1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Positions pushed since the last reset.
    pub fn positions_seen(&self) -> usize {
        self.pushed
    }

    /// Bytes of keys and values currently allocated.
    pub fn allocated_bytes(&self) -> usize {
        (self.keys.capacity() + self.values.capacity()) * 4
    }

    /// Appends one position, overwriting the oldest one when full.
    pub fn push(&mut self, key: &[f32], value: &[f32]) {
        debug_assert_eq!(key.len(), self.width);
        debug_assert_eq!(value.len(), self.width);
        if self.len() < self.capacity {
            if self.keys.capacity() == 0 {
                // Grow in a few steps; never beyond the window.
                let first = self.capacity.min(64) * self.width;
                self.keys.reserve_exact(first);
                self.values.reserve_exact(first);
            } else if self.keys.len() == self.keys.capacity() {
                let target = (self.keys.capacity() * 2).min(self.capacity * self.width);
                self.keys.reserve_exact(target - self.keys.len());
                self.values.reserve_exact(target - self.values.len());
            }
            self.keys.extend_from_slice(key);
            self.values.extend_from_slice(value);
        } else {
            let range = self.next_slot * self.width..(self.next_slot + 1) * self.width;
            self.keys[range.clone()].copy_from_slice(key);
            self.values[range].copy_from_slice(value);
            self.next_slot = (self.next_slot + 1) % self.capacity;
        }
        self.pushed += 1;
    }

    /// Keys of the held positions, `[len, width]` in slot order.
    pub fn keys(&self) -> &[f32] {
        &self.keys
    }

    /// Values of the held positions, `[len, width]` in slot order.
    pub fn values(&self) -> &[f32] {
        &self.values
    }

    /// Forgets every position (keeps the allocation).
    pub fn reset(&mut self) {
        self.keys.clear();
        self.values.clear();
        self.next_slot = 0;
        self.pushed = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_capacity_positions_with_bounded_memory() {
        let mut c = KvCache::new(3, 2);
        for p in 0..10 {
            let v = p as f32;
            c.push(&[v, v], &[-v, -v]);
            assert_eq!(c.len(), (p + 1).min(3));
        }
        let mut held: Vec<f32> = c.keys().chunks(2).map(|k| k[0]).collect();
        held.sort_by(f32::total_cmp);
        assert_eq!(held, vec![7.0, 8.0, 9.0]);
        assert!(c.allocated_bytes() <= 2 * 3 * 2 * 4);
        assert_eq!(c.positions_seen(), 10);
        c.reset();
        assert!(c.is_empty());
    }
}
