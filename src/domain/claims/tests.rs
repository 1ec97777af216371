use super::*;

fn target(api_version: &str, namespace: &str, name: &str) -> TargetRef {
    TargetRef {
        api_version: api_version.into(),
        kind: "Deployment".into(),
        namespace: namespace.into(),
        name: name.into(),
    }
}

fn hpa(namespace: &str, name: &str, on: &str) -> Claimant {
    Claimant {
        kind: ClaimantKind::HorizontalPodAutoscaler,
        namespace: namespace.into(),
        name: name.into(),
        target: TargetKey::new("apps/v1", "Deployment", namespace, on),
        scaled_object: None,
        replicas: Some(HpaReplicas { desired: Some(7), current: Some(5), last_scale_time: None }),
    }
}

fn scaled_object(namespace: &str, name: &str, on: &str) -> Claimant {
    Claimant {
        kind: ClaimantKind::ScaledObject,
        namespace: namespace.into(),
        name: name.into(),
        target: TargetKey::new("apps/v1", "Deployment", namespace, on),
        scaled_object: None,
        replicas: None,
    }
}

const KINDS: [ClaimantKind; 2] = [ClaimantKind::HorizontalPodAutoscaler, ClaimantKind::ScaledObject];

fn listed(scopes: &[Scope]) -> ClaimIndex {
    let mut index = ClaimIndex::new(&KINDS, scopes);
    for scope in scopes {
        for kind in KINDS {
            index.reset(kind, scope, Vec::new());
        }
    }
    index
}

#[test]
fn nothing_is_free_until_every_watch_covering_the_target_has_listed() {
    let mut index = ClaimIndex::new(&KINDS, &[None]);
    let web = target("apps/v1", "shop", "web");
    let Claims::Unknown(why) = index.claims(&web) else { panic!("known before any list") };
    assert!(why.contains("HorizontalPodAutoscalers and KEDA ScaledObjects"), "{why}");
    index.reset(ClaimantKind::HorizontalPodAutoscaler, &None, Vec::new());
    let Claims::Unknown(why) = index.claims(&web) else { panic!("known before the ScaledObjects listed") };
    assert!(why.contains("KEDA ScaledObjects") && !why.contains("HorizontalPodAutoscalers"), "{why}");
    assert!(!index.is_synced());
    // A cluster without KEDA: the driver resets the kind empty, as a listing of nothing.
    index.reset(ClaimantKind::ScaledObject, &None, Vec::new());
    assert_eq!(index.claims(&web), Claims::Free);
    assert!(index.is_synced());
}

#[test]
fn a_namespace_no_watch_covers_is_not_known_to_be_free() {
    let index = listed(&[Some("shop".into())]);
    assert_eq!(index.claims(&target("apps/v1", "shop", "web")), Claims::Free);
    let Claims::Unknown(why) = index.claims(&target("apps/v1", "other", "web")) else { panic!("free unwatched") };
    assert!(why.contains("namespace other") && why.contains("namespaces setting"), "{why}");
}

#[test]
fn an_hpa_claims_its_target_whatever_version_reaches_it_and_lets_go_when_deleted() {
    let mut index = listed(&[None]);
    index.apply(hpa("shop", "web", "web"));
    let claimed = index.claims(&target("apps/v1beta2", "shop", "web"));
    assert_eq!(claimed, Claims::Claimed(vec![hpa("shop", "web", "web")]));
    // Another object of that name in another namespace or group is another target.
    assert_eq!(index.claims(&target("apps/v1", "other", "web")), Claims::Free);
    assert_eq!(
        index.claims(&TargetRef { kind: "StatefulSet".into(), ..target("apps/v1", "shop", "web") }),
        Claims::Free
    );
    assert_eq!(index.hpa_replicas(&target("apps/v1", "shop", "web"))[0].0, "HorizontalPodAutoscaler/shop/web");
    assert_eq!(index.hpa_replicas(&target("apps/v1", "shop", "web"))[0].1.desired, Some(7));
    index.delete(ClaimantKind::HorizontalPodAutoscaler, "shop", "web");
    assert_eq!(index.claims(&target("apps/v1", "shop", "web")), Claims::Free);
    assert!(index.by_target.is_empty(), "nothing kept of a deleted claimant");
}

#[test]
fn a_claimant_that_moves_to_another_target_leaves_the_first() {
    let mut index = listed(&[None]);
    index.apply(hpa("shop", "h", "web"));
    index.apply(hpa("shop", "h", "api"));
    assert_eq!(index.claims(&target("apps/v1", "shop", "web")), Claims::Free);
    assert!(matches!(index.claims(&target("apps/v1", "shop", "api")), Claims::Claimed(_)));
}

#[test]
fn a_listing_replaces_only_its_kind_in_its_scope() {
    let mut index = listed(&[Some("a".into()), Some("b".into())]);
    index.apply(hpa("a", "old", "web"));
    index.apply(hpa("b", "kept", "web"));
    index.apply(scaled_object("a", "so", "web"));
    index.reset(ClaimantKind::HorizontalPodAutoscaler, &Some("a".into()), vec![hpa("a", "new", "web")]);
    let names = |ns: &str| match index.claims(&target("apps/v1", ns, "web")) {
        Claims::Claimed(c) => c.iter().map(|c| c.name.clone()).collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    let mut a = names("a");
    a.sort();
    assert_eq!(a, ["new", "so"]);
    assert_eq!(names("b"), ["kept"]);
}

#[test]
fn the_guard_withholds_a_claimed_or_unknown_target_unless_observing_or_taking_over() {
    let claimed = || Claims::Claimed(vec![hpa("shop", "web", "web")]);
    assert_eq!(guard(Claims::Free, false, false), Verdict::Write);
    assert_eq!(guard(Claims::Free, true, false), Verdict::Write);
    let Verdict::Withhold { claimants, why } = guard(claimed(), false, false) else { panic!("not withheld") };
    assert_eq!(claimants.len(), 1);
    assert!(why.starts_with("HorizontalPodAutoscaler shop/web already scales this target"), "{why}");
    assert!(why.contains("take_over = true"), "{why}");
    assert_eq!(guard(claimed(), true, false), Verdict::TakeOver(vec![hpa("shop", "web", "web")]));
    assert_eq!(guard(claimed(), false, true), Verdict::Observe(vec![hpa("shop", "web", "web")]));
    // Not known yet: withheld, take_over or not; an observer writes nothing anyway.
    let unknown = || Claims::Unknown("not listed".into());
    assert!(matches!(guard(unknown(), true, false), Verdict::Withhold { ref claimants, .. } if claimants.is_empty()));
    assert_eq!(guard(unknown(), false, true), Verdict::Observe(Vec::new()));
}

#[test]
fn the_note_names_each_claimant_and_keda_s_scaled_object() {
    let keda = Claimant { name: "keda-hpa-web".into(), scaled_object: Some("web".into()), ..hpa("shop", "x", "web") };
    let verdict = guard(Claims::Claimed(vec![keda, scaled_object("shop", "web", "web")]), false, false);
    let note = ClaimNote::of(&verdict, "Deployment shop/web").expect("a note");
    assert!(note.withheld && !note.taking_over);
    assert_eq!(
        note.claimed_by.iter().map(|c| &**c).collect::<Vec<_>>(),
        ["HorizontalPodAutoscaler/shop/keda-hpa-web", "ScaledObject/shop/web"]
    );
    assert!(
        note.sentence.starts_with(
            "HorizontalPodAutoscaler shop/keda-hpa-web (KEDA's, for ScaledObject shop/web) and ScaledObject shop/web"
        ),
        "{}",
        note.sentence
    );
    assert_eq!(note.held(), Some(note.sentence.as_str()));
    let taking =
        ClaimNote::of(&Verdict::TakeOver(vec![hpa("shop", "web", "web")]), "Deployment shop/web").expect("note");
    assert_eq!(
        taking.sentence,
        "taking over Deployment shop/web from HorizontalPodAutoscaler shop/web (take_over = true): starting from its \
         current replicas"
    );
    assert_eq!(taking.held(), None);
    assert_eq!(ClaimNote::of(&Verdict::Write, "x"), None);
    assert_eq!(ClaimNote::of(&Verdict::Observe(Vec::new()), "x"), None);
}
