//! A cycle's query plan, whichever the backend: the requests that go out, the query texts each
//! one carries, and which of the cycle's queries each text answers.
//!
//! Each backend compiles its own plan (Datadog joins several texts per request and folds
//! per-workload queries into grouped ones; Prometheus sends one text per request and folds
//! the same way); this is the shape they share, for `watermarkd query` to show and for the
//! daemon's `watermarkd_query_plan_*` series to count.

/// What one cycle sends.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueryPlan {
    pub requests: Vec<PlannedFetch>,
}

/// One HTTP request of the plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlannedFetch {
    pub parts: Vec<PlanPart>,
}

/// One query text in a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanPart {
    /// The text as sent.
    pub text: String,
    /// The cycle's queries it answers: indexes into the queries that were planned. Several
    /// for a folded text (one group of the answer each), or for identical queries asked by
    /// several autoscalers (all take the one answer).
    pub members: Vec<usize>,
    /// Whether the text is a grouped query standing for several different member queries.
    pub folded: bool,
}

impl QueryPlan {
    /// Requests in the plan.
    pub fn request_count(&self) -> usize {
        self.requests.len()
    }

    /// The cycle's queries answered through a folded text.
    pub fn folded_members(&self) -> usize {
        self.parts().filter(|p| p.folded).map(|p| p.members.len()).sum()
    }

    /// The cycle's queries answered by a text of their own (identical queries counted each).
    pub fn unfolded_members(&self) -> usize {
        self.parts().filter(|p| !p.folded).map(|p| p.members.len()).sum()
    }

    /// What the daemon exports of it (`watermarkd_query_plan_*`).
    pub fn counts(&self) -> crate::adapters::telemetry::PlanCounts {
        let mut counts = crate::adapters::telemetry::PlanCounts::default();
        for request in &self.requests {
            for part in &request.parts {
                counts.add(part.members.len(), part.folded);
            }
            counts.members_per_request.push(request.member_count());
        }
        counts
    }

    fn parts(&self) -> impl Iterator<Item = &PlanPart> {
        self.requests.iter().flat_map(|r| r.parts.iter())
    }
}

impl PlannedFetch {
    /// The cycle's queries this request answers.
    pub fn member_count(&self) -> usize {
        self.parts.iter().map(|p| p.members.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_the_parts() {
        let part = |members: Vec<usize>, folded| PlanPart { text: "q".into(), members, folded };
        let plan = QueryPlan {
            requests: vec![
                PlannedFetch { parts: vec![part(vec![0, 1, 2], true), part(vec![3], false)] },
                PlannedFetch { parts: vec![part(vec![4, 5], false)] },
            ],
        };
        assert_eq!(plan.request_count(), 2);
        assert_eq!(plan.folded_members(), 3);
        assert_eq!(plan.unfolded_members(), 3);
        assert_eq!(plan.requests[0].member_count(), 4);
        assert_eq!(QueryPlan::default().folded_members(), 0);
        let counts = plan.counts();
        assert_eq!((counts.members_per_request, counts.folded, counts.unfolded), (vec![4, 2], 3, 3));
    }
}
