//! A cycle's queries compiled into requests: each distinct text once with the queries that
//! ask it, the texts folded into grouped queries where they may be (`fold`) and batched into
//! requests (`batch`), and the same plan as `watermarkd query` shows it and as the daemon
//! counts it. Pure but for the refused shapes it reads.

use super::*;

/// A cycle's queries by text: each distinct text once, in the order first asked.
pub(super) struct Distinct<'a> {
    pub(super) texts: Vec<&'a str>,
    /// For each query, the index of its text.
    pub(super) slots: Vec<usize>,
    /// For each text, the queries that ask it.
    pub(super) askers: Askers,
}

impl<'a> Distinct<'a> {
    pub(super) fn of(queries: &'a [MetricQuery]) -> Self {
        let (texts, slots) = crate::adapters::backend::distinct_texts(queries);
        let askers = Askers::of(&slots, texts.len());
        Distinct { texts, slots, askers }
    }
}

/// For each text, the queries that ask it, in one vector (queries grouped by text) and their
/// starts: two allocations a cycle rather than one per text, which at 10,000 texts left the
/// heap fragmented after every cycle.
pub(super) struct Askers {
    pub(super) queries: Vec<usize>,
    /// `starts[d]..starts[d + 1]` in `queries` ask text `d`.
    pub(super) starts: Vec<usize>,
}

impl Askers {
    /// From each query's text index (`slots`), for `texts` texts.
    pub(super) fn of(slots: &[usize], texts: usize) -> Askers {
        let mut starts = vec![0usize; texts + 1];
        for &d in slots {
            if let Some(count) = starts.get_mut(d + 1) {
                *count += 1;
            }
        }
        // Counts to starts: each the sum of the counts before it.
        let mut sum = 0;
        for start in &mut starts {
            sum += *start;
            *start = sum;
        }
        let mut next = starts.clone();
        let mut queries = vec![0usize; slots.len()];
        for (q, &d) in slots.iter().enumerate() {
            if let Some(at) = next.get_mut(d) {
                if let Some(slot) = queries.get_mut(*at) {
                    *slot = q;
                }
                *at += 1;
            }
        }
        Askers { queries, starts }
    }

    /// The queries asking text `d`, in order.
    pub(super) fn of_text(&self, d: usize) -> &[usize] {
        match (self.starts.get(d), self.starts.get(d + 1)) {
            (Some(&start), Some(&end)) => self.queries.get(start..end).unwrap_or_default(),
            _ => &[],
        }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &[usize]> {
        (0..self.starts.len().saturating_sub(1)).map(|d| self.of_text(d))
    }
}

/// The plan as the shared type: `inputs_of(q)` are the cycle's queries behind text `q`.
pub(super) fn plan_of(
    planned: &[batch::PlannedRequest],
    units: &[fold::Unit],
    unit_texts: &[&str],
    inputs_of: impl Fn(usize) -> Vec<usize>,
) -> QueryPlan {
    let requests = planned
        .iter()
        .map(|request| PlannedFetch {
            parts: request
                .queries
                .iter()
                .filter_map(|&u| units.get(u).zip(unit_texts.get(u)))
                .map(|(unit, text)| PlanPart {
                    text: text.to_string(),
                    members: unit.members().flat_map(&inputs_of).collect(),
                    folded: matches!(unit, fold::Unit::Folded(_)),
                })
                .collect(),
        })
        .collect();
    QueryPlan { requests }
}

/// The same plan counted: what the daemon exports every cycle, without copying every text.
pub(super) fn plan_counts(
    planned: &[batch::PlannedRequest],
    units: &[fold::Unit],
    inputs_of: impl Fn(usize) -> usize,
) -> PlanCounts {
    let mut counts = PlanCounts::default();
    for request in planned {
        let mut in_request = 0;
        for unit in request.queries.iter().filter_map(|&u| units.get(u)) {
            let members: usize = unit.members().map(&inputs_of).sum();
            counts.add(members, matches!(unit, fold::Unit::Folded(_)));
            in_request += members;
        }
        counts.members_per_request.push(in_request);
    }
    counts
}

/// What a cycle compiled its texts into.
pub(super) struct Compiled {
    /// Each a text to send: a query alone or a grouped one.
    pub(super) units: Vec<fold::Unit>,
    /// The units batched into requests (`queries` index `units`).
    pub(super) planned: Vec<batch::PlannedRequest>,
    /// Units that cannot be sent at all.
    pub(super) too_long: Vec<batch::TooLong>,
}

impl fold::Unit {
    pub(super) fn text<'a>(&'a self, texts: &[&'a str]) -> &'a str {
        match self {
            // A unit names only texts it was folded from.
            fold::Unit::Alone(q) => texts.get(*q).copied().unwrap_or_default(),
            fold::Unit::Folded(f) => &f.text,
        }
    }

    /// The texts (indexes into the texts folded) this unit answers.
    pub(super) fn members(&self) -> Box<dyn Iterator<Item = usize> + '_> {
        match self {
            fold::Unit::Alone(q) => Box::new(std::iter::once(*q)),
            fold::Unit::Folded(f) => Box::new(f.members.iter().map(|(q, _)| *q)),
        }
    }
}

/// One sub-query of a request, with what it stands for.
#[derive(Clone, Debug)]
pub(super) enum Part {
    /// A query as written: (index into the cycle's texts, the text).
    Alone(usize, String),
    /// A grouped query: its text, keys and shape, and each member's index, text and values.
    Folded { text: String, keys: Vec<String>, shape: u64, members: Vec<(usize, String, Vec<String>)> },
}

impl Part {
    pub(super) fn of(unit: &fold::Unit, texts: &[&str]) -> Part {
        match unit {
            fold::Unit::Alone(q) => Part::Alone(*q, unit.text(texts).to_string()),
            fold::Unit::Folded(f) => Part::Folded {
                text: f.text.clone(),
                keys: f.keys.clone(),
                shape: f.shape,
                members: f
                    .members
                    .iter()
                    .map(|(q, values)| (*q, texts.get(*q).copied().unwrap_or_default().to_string(), values.clone()))
                    .collect(),
            },
        }
    }

    pub(super) fn layout(&self) -> SubQuery {
        match self {
            Part::Alone(..) => SubQuery::One,
            Part::Folded { keys, members, .. } => {
                SubQuery::Groups { keys: keys.clone(), members: members.iter().map(|(_, _, v)| v.clone()).collect() }
            }
        }
    }

    /// Every member as (index, text): the part itself when alone.
    pub(super) fn singles(&self) -> Vec<(usize, String)> {
        match self {
            Part::Alone(q, text) => vec![(*q, text.clone())],
            Part::Folded { members, .. } => members.iter().map(|(q, text, _)| (*q, text.clone())).collect(),
        }
    }
}

impl Inner {
    /// Folds `texts` (distinct, in order of priority) into units and batches them into
    /// requests. A grouped query is kept short enough to go in a request of its own.
    pub(super) fn compile(&self, texts: &[&str], from: i64, to: i64, now: Instant) -> Compiled {
        let endpoint = self.v1_endpoint();
        let prefix = batch::url_prefix_len(&endpoint, from, to);
        let alone = || (0..texts.len()).map(fold::Unit::Alone).collect();
        let units = if self.fold_queries {
            let mut refused = lock(&self.refused_shapes);
            refused.retain(|_, until| *until > now);
            let key = self.texts_key(texts, refused.keys());
            let mut unfoldable = lock(&self.unfoldable);
            if *unfoldable == Some(key) {
                alone()
            } else {
                let units =
                    fold::fold(texts, MAX_URL_CHARS.saturating_sub(prefix), &|shape| refused.contains_key(&shape));
                *unfoldable = units.iter().all(|u| matches!(u, fold::Unit::Alone(_))).then_some(key);
                units
            }
        } else {
            alone()
        };
        let unit_texts: Vec<&str> = units.iter().map(|u| u.text(texts)).collect();
        let (planned, too_long) = batch::plan(&endpoint, from, to, &unit_texts);
        Compiled { units, planned, too_long }
    }

    /// The same for the same texts in any order and the same refused shapes: a sum of the
    /// texts' keyed hashes. Two sets with one key only cost a cycle without folding.
    fn texts_key<'a>(&self, texts: &[&str], refused: impl Iterator<Item = &'a u64>) -> u64 {
        use std::hash::BuildHasher;
        let texts_sum = texts.iter().fold(0u64, |sum, text| sum.wrapping_add(self.text_key(text)));
        let refused_sum = refused.fold(0u64, |sum, shape| sum.wrapping_add(*shape));
        self.text_keys.hash_one((texts.len(), texts_sum, refused_sum))
    }
}
