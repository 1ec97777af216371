//! The recent evaluations of one autoscaler, for the status API and page: a bounded ring of
//! samples (time, each metric's value, the proposal, the replicas, what happened), kept
//! compact because there is one per autoscaler and 10,000 autoscalers must fit.
//!
//! Samples are encoded into one byte buffer, in blocks of [`BLOCK`] samples. Within a block a
//! sample stores only what changed since the one before: a header byte says which fields
//! follow, the time is a varint of the seconds since the previous sample, values are `f32`.
//! A steady autoscaler costs 2 bytes a sample; one whose value moves every time, 6 (plus 4
//! per further metric). The first sample of a block is whole (its time absolute), so the
//! oldest block can be dropped without decoding anything. The ring keeps at least `capacity`
//! samples and at most `capacity + BLOCK - 1`.
//!
//! Watermarks change only when a rule does: they are kept as a short list of changes, not
//! per sample.
//!
//! What held or bent an evaluation (a [`Restriction`]) rides in the four high bits of the
//! sample's header byte, which the other fields leave free: it costs no byte.

use std::collections::VecDeque;

use crate::domain::restriction::Restriction;

/// Samples per block: the unit the ring drops its oldest samples in.
pub const BLOCK: u16 = 32;

/// What happened at one evaluation, besides its numbers: flags (the low byte), and what held
/// or bent it (bits 8 to 11: a [`Restriction::code`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Marks(u16);

impl Marks {
    /// The replicas went up (or would have, in a dry run or while paused).
    pub const SCALED_UP: Marks = Marks(1);
    pub const SCALED_DOWN: Marks = Marks(2);
    /// A limit, window or delay kept the replicas from what the metrics asked for.
    pub const RESTRICTED: Marks = Marks(4);
    /// The declared fallback decided.
    pub const FALLBACK: Marks = Marks(8);
    /// Paused: decided and reported, nothing written.
    pub const PAUSED: Marks = Marks(16);
    /// The evaluation could not decide (the target or the state was unreadable).
    pub const FAILED: Marks = Marks(32);
    /// No metric had a usable value.
    pub const NO_DATA: Marks = Marks(64);

    const NAMES: [(Marks, &'static str); 7] = [
        (Marks::SCALED_UP, "scaled_up"),
        (Marks::SCALED_DOWN, "scaled_down"),
        (Marks::RESTRICTED, "restricted"),
        (Marks::FALLBACK, "fallback"),
        (Marks::PAUSED, "paused"),
        (Marks::FAILED, "failed"),
        (Marks::NO_DATA, "no_data"),
    ];

    pub fn empty() -> Marks {
        Marks(0)
    }

    pub fn with(self, other: Marks, on: bool) -> Marks {
        if on {
            Marks(self.0 | other.0)
        } else {
            self
        }
    }

    pub fn contains(self, other: Marks) -> bool {
        self.0 & other.0 == other.0
    }

    /// These marks, with what held or bent the evaluation (as the simulator's chart names it).
    pub fn restricted_by(self, restriction: Option<Restriction>) -> Marks {
        let code = u16::from(restriction.map_or(0, Restriction::code) & 0x0f);
        Marks((self.0 & 0x00ff) | code << 8)
    }

    /// What held or bent the evaluation, if anything did.
    pub fn restriction(self) -> Option<Restriction> {
        Restriction::from_code(((self.0 >> 8) & 0x0f) as u8)
    }

    /// The flags alone, as a sample stores them in its marks byte.
    fn flags(self) -> u8 {
        (self.0 & 0x00ff) as u8
    }

    /// The names of the flags set, for the API.
    pub fn names(self) -> Vec<&'static str> {
        Marks::NAMES.iter().filter(|(m, _)| self.contains(*m)).map(|(_, n)| *n).collect()
    }

    /// The name of a mark, as `names` gives it, when `text` is one (an API answer read back).
    pub fn known_name(text: &str) -> Option<&'static str> {
        Marks::NAMES.iter().map(|(_, name)| *name).find(|name| *name == text)
    }

    /// The flags of these names (as [`Marks::names`] gives them); other names are not marks.
    pub fn from_names(names: &[&str]) -> Marks {
        Marks::NAMES.iter().filter(|(_, n)| names.contains(n)).fold(Marks::empty(), |all, (m, _)| all.with(*m, true))
    }
}

/// One evaluation, as recorded and as read back.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Unix seconds.
    pub at: i64,
    /// Each metric's value (`None`: no usable value), in the rule's order.
    pub values: Vec<Option<f32>>,
    /// What the metrics asked for, before limits.
    pub proposed: Option<u32>,
    /// The replicas decided (the spec after the evaluation).
    pub replicas: u32,
    pub marks: Marks,
}

/// A change of the watermarks: from `at` on, each metric's (low, high).
#[derive(Clone, Debug, PartialEq)]
pub struct Bands {
    pub at: i64,
    pub watermarks: Box<[(f32, f32)]>,
}

// Header bits of an encoded sample.
const SAME_VALUES: u8 = 1;
const SAME_REPLICAS: u8 = 2;
const SAME_PROPOSED: u8 = 4;
const HAS_MARKS: u8 = 8;
/// The high four bits: the restriction's code (0: none).
const RESTRICTION_SHIFT: u8 = 4;

/// A sample's header: `bits`, the flags byte following when there are flags, and the
/// restriction's code above them.
fn header_of(bits: u8, marks: Marks) -> u8 {
    let has_marks = if marks.flags() == 0 { 0 } else { HAS_MARKS };
    bits | has_marks | (marks.restriction().map_or(0, Restriction::code) << RESTRICTION_SHIFT)
}

#[derive(Clone, Copy, Debug)]
struct BlockHead {
    samples: u16,
    metrics: u8,
    /// Bytes of the block in the buffer.
    len: u32,
}

/// The ring. See the module comment.
#[derive(Clone, Debug, Default)]
pub struct History {
    capacity: u16,
    bytes: Vec<u8>,
    blocks: VecDeque<BlockHead>,
    /// The last sample pushed, which the next one is encoded against.
    last: Option<Sample>,
    bands: Vec<Bands>,
}

impl History {
    /// A ring keeping at least `capacity` samples (at least one block's worth).
    pub fn new(capacity: u16) -> History {
        History { capacity: capacity.max(BLOCK), ..History::default() }
    }

    /// Whether this ring keeps anything: a default one (no history asked for) keeps nothing.
    pub fn keeps(&self) -> bool {
        self.capacity > 0
    }

    /// Samples held now.
    pub fn len(&self) -> usize {
        self.blocks.iter().map(|b| usize::from(b.samples)).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Heap bytes held: what the benchmark adds up over every autoscaler.
    pub fn heap_bytes(&self) -> usize {
        self.bytes.capacity()
            + self.blocks.capacity() * std::mem::size_of::<BlockHead>()
            + self.last.as_ref().map_or(0, |s| s.values.capacity() * std::mem::size_of::<Option<f32>>())
            + self.bands.capacity() * std::mem::size_of::<Bands>()
            + self.bands.iter().map(|b| b.watermarks.len() * std::mem::size_of::<(f32, f32)>()).sum::<usize>()
    }

    /// Records one evaluation and the watermarks it was judged by.
    pub fn push(&mut self, sample: Sample, watermarks: &[(f32, f32)]) {
        if !self.keeps() {
            return;
        }
        if self.bands.last().is_none_or(|b| *b.watermarks != *watermarks) {
            self.bands.push(Bands { at: sample.at, watermarks: watermarks.into() });
        }
        let metrics = u8::try_from(sample.values.len()).unwrap_or(u8::MAX);
        let values = sample.values.get(..usize::from(metrics)).unwrap_or(&sample.values);
        let open = self.blocks.back().filter(|b| b.samples < BLOCK && b.metrics == metrics).is_some();
        // Grown by an eighth at a time, not doubled: a full ring's buffer stays near its need
        // instead of up to twice it (the ring's length only moves by a block).
        let largest = 1 + 10 + 1 + 4 * values.len() + 10;
        if self.bytes.capacity() - self.bytes.len() < largest {
            self.bytes.reserve_exact(largest.max(self.bytes.len() / 8));
        }
        if !open && self.blocks.len() == self.blocks.capacity() {
            self.blocks.reserve_exact(1);
        }
        let start = self.bytes.len();
        match (&self.last, open) {
            (Some(last), true) => encode_after(&mut self.bytes, last, &sample, values),
            _ => {
                encode_whole(&mut self.bytes, &sample, values);
                self.blocks.push_back(BlockHead { samples: 0, metrics, len: 0 });
            }
        }
        let added = u32::try_from(self.bytes.len() - start).unwrap_or(u32::MAX);
        if let Some(block) = self.blocks.back_mut() {
            block.samples += 1;
            block.len = block.len.saturating_add(added);
        }
        self.last = Some(sample);
        self.drop_old();
    }

    /// Drops whole blocks from the front while what stays still holds `capacity` samples;
    /// and the watermark changes before the oldest sample but the one in force then.
    fn drop_old(&mut self) {
        let mut len = self.len();
        while let Some(first) = self.blocks.front().copied() {
            if len - usize::from(first.samples) < usize::from(self.capacity) {
                break;
            }
            self.bytes.drain(..first.len as usize);
            self.blocks.pop_front();
            len -= usize::from(first.samples);
        }
        if let Some(oldest) = self.oldest_at() {
            let in_force = self.bands.iter().rposition(|b| b.at <= oldest).unwrap_or(0);
            self.bands.drain(..in_force);
        }
    }

    /// The time of the oldest sample held (decoding one sample only).
    pub fn oldest_at(&self) -> Option<i64> {
        let first = self.blocks.front()?;
        let mut at = 0;
        decode_block(self.bytes.get(..first.len as usize)?, first.metrics, |s| {
            at = s.at;
            false
        });
        Some(at)
    }

    /// Every sample held, oldest first.
    pub fn samples(&self) -> Vec<Sample> {
        let mut out = Vec::with_capacity(self.len());
        let mut offset = 0usize;
        for block in &self.blocks {
            let end = offset + block.len as usize;
            if let Some(bytes) = self.bytes.get(offset..end) {
                decode_block(bytes, block.metrics, |s| {
                    out.push(s);
                    true
                });
            }
            offset = end;
        }
        out
    }

    /// The watermark changes that cover the samples held, oldest first.
    pub fn bands(&self) -> &[Bands] {
        &self.bands
    }
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn get_varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

fn unzigzag(value: u64) -> i64 {
    ((value >> 1) as i64) ^ -((value & 1) as i64)
}

/// `None` as NaN: no metric value stored here is NaN (the decision refuses them).
fn put_values(out: &mut Vec<u8>, values: &[Option<f32>]) {
    for value in values {
        out.extend_from_slice(&value.unwrap_or(f32::NAN).to_le_bytes());
    }
}

fn proposed_code(proposed: Option<u32>) -> u64 {
    proposed.map_or(0, |p| u64::from(p) + 1)
}

fn encode_whole(out: &mut Vec<u8>, sample: &Sample, values: &[Option<f32>]) {
    let header = header_of(0, sample.marks);
    out.push(header);
    put_varint(out, zigzag(sample.at));
    if header & HAS_MARKS != 0 {
        out.push(sample.marks.flags());
    }
    put_values(out, values);
    put_varint(out, u64::from(sample.replicas));
    put_varint(out, proposed_code(sample.proposed));
}

fn encode_after(out: &mut Vec<u8>, last: &Sample, sample: &Sample, values: &[Option<f32>]) {
    let same_values = last.values.len() == values.len()
        && last.values.iter().zip(values).all(|(a, b)| a.map(f32::to_bits) == b.map(f32::to_bits));
    let mut header = 0;
    if same_values {
        header |= SAME_VALUES;
    }
    if last.replicas == sample.replicas {
        header |= SAME_REPLICAS;
    }
    if last.proposed == sample.proposed {
        header |= SAME_PROPOSED;
    }
    let header = header_of(header, sample.marks);
    out.push(header);
    // Time only moves forward in the ring; a clock stepping back is recorded as no time.
    put_varint(out, u64::try_from(sample.at - last.at).unwrap_or(0));
    if header & HAS_MARKS != 0 {
        out.push(sample.marks.flags());
    }
    if !same_values {
        put_values(out, values);
    }
    if header & SAME_REPLICAS == 0 {
        put_varint(out, u64::from(sample.replicas));
    }
    if header & SAME_PROPOSED == 0 {
        put_varint(out, proposed_code(sample.proposed));
    }
}

/// Decodes one block, handing each sample to `each` until it returns false.
fn decode_block(bytes: &[u8], metrics: u8, mut each: impl FnMut(Sample) -> bool) {
    let mut at = 0usize;
    let mut previous: Option<Sample> = None;
    while at < bytes.len() {
        let Some(sample) = decode_one(bytes, &mut at, metrics, previous.as_ref()) else { return };
        if !each(sample.clone()) {
            return;
        }
        previous = Some(sample);
    }
}

fn decode_one(bytes: &[u8], at: &mut usize, metrics: u8, previous: Option<&Sample>) -> Option<Sample> {
    let header = *bytes.get(*at)?;
    *at += 1;
    let time = get_varint(bytes, at)?;
    let time = match previous {
        None => unzigzag(time),
        Some(p) => p.at.saturating_add(i64::try_from(time).unwrap_or(i64::MAX)),
    };
    let flags = if header & HAS_MARKS != 0 {
        let m = *bytes.get(*at)?;
        *at += 1;
        m
    } else {
        0
    };
    let marks = Marks(u16::from(flags)).restricted_by(Restriction::from_code(header >> RESTRICTION_SHIFT));
    let values = match previous {
        Some(p) if header & SAME_VALUES != 0 => p.values.clone(),
        _ => {
            let mut values = Vec::with_capacity(usize::from(metrics));
            for _ in 0..metrics {
                let raw: [u8; 4] = bytes.get(*at..*at + 4)?.try_into().ok()?;
                *at += 4;
                let value = f32::from_le_bytes(raw);
                values.push((!value.is_nan()).then_some(value));
            }
            values
        }
    };
    let replicas = match previous {
        Some(p) if header & SAME_REPLICAS != 0 => p.replicas,
        _ => u32::try_from(get_varint(bytes, at)?).unwrap_or(u32::MAX),
    };
    let proposed = match previous {
        Some(p) if header & SAME_PROPOSED != 0 => p.proposed,
        _ => match get_varint(bytes, at)? {
            0 => None,
            code => Some(u32::try_from(code - 1).unwrap_or(u32::MAX)),
        },
    };
    Some(Sample { at: time, values, proposed, replicas, marks })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at: i64, value: Option<f32>, replicas: u32) -> Sample {
        Sample { at, values: vec![value], proposed: Some(replicas), replicas, marks: Marks::empty() }
    }

    #[test]
    fn what_goes_in_comes_out_in_order() {
        let mut history = History::new(64);
        let mut pushed = Vec::new();
        for i in 0..50i64 {
            let value = if i % 7 == 3 { None } else { Some(0.5 + (i % 5) as f32 / 10.0) };
            let mut s = sample(1_700_000_000 + i * 15, value, 2 + (i / 10) as u32);
            s.marks = Marks::empty().with(Marks::SCALED_UP, i % 10 == 0).with(Marks::RESTRICTED, i == 21);
            s.proposed = (i % 3 != 0).then_some(9);
            history.push(s.clone(), &[(0.6, 0.9)]);
            pushed.push(s);
        }
        assert_eq!(history.samples(), pushed);
        assert_eq!(history.bands(), &[Bands { at: 1_700_000_000, watermarks: vec![(0.6, 0.9)].into() }]);
    }

    #[test]
    fn the_ring_keeps_at_least_its_capacity_and_drops_whole_blocks() {
        let mut history = History::new(240);
        for i in 0..1_000i64 {
            history.push(sample(i * 15, Some(i as f32), 3), &[(1.0, 2.0)]);
            assert!(history.len() >= (i as usize + 1).min(240));
            assert!(history.len() < 240 + usize::from(BLOCK));
        }
        let samples = history.samples();
        assert_eq!(samples.last().map(|s| s.at), Some(999 * 15));
        assert_eq!(samples.first().map(|s| s.values[0]), Some(Some((1_000 - samples.len()) as f32)));
        assert!(samples.windows(2).all(|w| w[1].at - w[0].at == 15));
    }

    #[test]
    fn a_steady_autoscaler_costs_two_bytes_a_sample_and_a_moving_one_six() {
        let mut steady = History::new(240);
        let mut moving = History::new(240);
        for i in 0..240i64 {
            steady.push(sample(i * 15, Some(0.7), 4), &[(0.6, 0.9)]);
            moving.push(sample(i * 15, Some(i as f32 * 0.01), 4), &[(0.6, 0.9)]);
        }
        // Each block's first sample is whole: about 12 bytes.
        let blocks = 240usize.div_ceil(usize::from(BLOCK));
        assert!(steady.bytes.len() <= 240 * 2 + blocks * 12, "{}", steady.bytes.len());
        assert!(moving.bytes.len() <= 240 * 6 + blocks * 12, "{}", moving.bytes.len());
    }

    #[test]
    fn watermark_changes_are_kept_while_a_sample_they_judged_is() {
        let mut history = History::new(32);
        history.push(sample(0, Some(1.0), 2), &[(0.5, 0.8)]);
        history.push(sample(15, Some(1.0), 2), &[(0.6, 0.9)]);
        assert_eq!(history.bands().len(), 2);
        for i in 2..100 {
            history.push(sample(i * 15, Some(1.0), 2), &[(0.6, 0.9)]);
        }
        assert_eq!(history.bands().len(), 1, "the first change judged nothing still held");
        assert_eq!(history.bands()[0].at, 15);
    }

    #[test]
    fn what_held_an_evaluation_comes_back_and_costs_no_byte() {
        let mut plain = History::new(64);
        let mut held = History::new(64);
        let mut pushed = Vec::new();
        for i in 0..40i64 {
            let restriction = Restriction::ALL.get(i as usize % 12).copied();
            let mut s = sample(i * 15, Some(1.0), 2);
            s.marks = s.marks.with(Marks::RESTRICTED, restriction.is_some()).restricted_by(restriction);
            held.push(s.clone(), &[(0.5, 0.8)]);
            plain.push(Sample { marks: s.marks.restricted_by(None), ..s.clone() }, &[(0.5, 0.8)]);
            pushed.push(s);
        }
        assert_eq!(held.samples(), pushed);
        assert_eq!(held.bytes.len(), plain.bytes.len());
        let window = Marks::empty().restricted_by(Some(Restriction::UpscaleWindow));
        assert_eq!((window.restriction(), window.names()), (Some(Restriction::UpscaleWindow), Vec::<&str>::new()));
        assert_eq!(
            Marks::from_names(&["fallback", "restricted", "nonsense"]),
            Marks::FALLBACK.with(Marks::RESTRICTED, true)
        );
    }

    #[test]
    fn a_change_in_the_number_of_metrics_starts_a_block() {
        let mut history = History::new(64);
        history.push(sample(0, Some(1.0), 2), &[(0.5, 0.8)]);
        let two = Sample { values: vec![Some(1.0), Some(2.0)], ..sample(15, None, 2) };
        history.push(two.clone(), &[(0.5, 0.8), (1.0, 3.0)]);
        assert_eq!(history.samples(), vec![sample(0, Some(1.0), 2), two]);
    }

    #[test]
    fn garbage_bytes_decode_to_fewer_samples_never_a_panic() {
        for len in 0..40 {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            decode_block(&bytes, 2, |_| true);
            decode_block(&[0xff; 12], 1, |_| true);
        }
    }
}
