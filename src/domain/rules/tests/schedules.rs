//! `[[autoscaler.schedule]]` and `paused_until`: what they read as, and how a wrong one is named.

use std::time::Duration;

use watermarkd_engine::Timestamp;

use super::*;
use crate::domain::schedule::{bounds_at, When};

fn with_schedule(windows: &str) -> String {
    format!("{BACKENDS}{BILLING}{windows}")
}

#[test]
fn weekly_and_cron_windows_are_read_with_their_zone_and_ramps() {
    let rules = parse(&with_schedule(
        r#"
[[autoscaler.schedule]]
name = "office"
time_zone = "Europe/Paris"
days = ["weekdays"]
start = "08:00"
end = "18:30"
min_replicas = 6
max_replicas = 8
ramp_in = "30m"

[[autoscaler.schedule]]
cron = "0 7 * * mon"
duration = "2h"
min_replicas = 9
"#,
    ));
    let billing = rules.autoscaler("billing").unwrap();
    let [office, monday] = &billing.schedules[..] else { panic!("two windows: {:?}", billing.schedules) };
    assert_eq!(office.name, "office");
    assert_eq!(office.time_zone.name, "Europe/Paris");
    assert_eq!((office.min_replicas, office.max_replicas), (6, Some(8)));
    assert_eq!(office.ramp_in, Duration::from_secs(1800));
    assert!(matches!(office.when, When::Weekly { days, .. } if days == [true, true, true, true, true, false, false]));
    assert_eq!(monday.name, "schedule[1]");
    assert_eq!(monday.time_zone.name, "UTC");
    assert!(matches!(&monday.when, When::Cron { duration, .. } if *duration == Duration::from_secs(7200)));
    // Monday 2026-11-23, 07:30 UTC: the cron window is open, 08:30 in Paris the office one.
    let at = Timestamp::from_unix_millis(1_795_419_000_000);
    let bounds = bounds_at(&billing.schedules, billing.rule.min_replicas(), billing.rule.max_replicas(), at);
    assert_eq!((bounds.min, bounds.max), (9, 9), "{bounds:?}");
}

#[test]
fn the_summary_says_when_each_window_next_opens_on_its_own_clock() {
    let rules = parse(&with_schedule(
        r#"
[[autoscaler.schedule]]
name = "office"
time_zone = "Europe/Paris"
days = ["weekdays"]
start = "08:00"
end = "18:30"
min_replicas = 6

[[autoscaler.schedule]]
cron = "@daily"
duration = "2h"
min_replicas = 5
time_zone = "America/New_York"
"#,
    ));
    // NOW is Monday 2026-11-23 00:00 UTC: 01:00 in Paris, Sunday 19:00 in New York.
    assert!(
        summary(rules.autoscaler("billing").unwrap()).ends_with(
            ", schedule: office (floor 6, next opens Mon 2026-11-23 08:00 Europe/Paris), schedule[1] (floor 5, next \
             opens Mon 2026-11-23 00:00 America/New_York)"
        ),
        "{}",
        summary(rules.autoscaler("billing").unwrap())
    );
}

#[test]
fn a_wrong_window_is_named_with_its_line_and_field() {
    let text = with_schedule(
        r#"
[[autoscaler.schedule]]
time_zone = "Mars/Olympus"
days = ["funday"]
start = "8h"
end = "18:00"
min_replicas = 12

[[autoscaler.schedule]]
cron = "0 7 * * mon"
days = ["mon"]
min_replicas = 2
max_replicas = 1

[[autoscaler.schedule]]
min_replicas = 2
"#,
    );
    let p = problems(&text);
    let line = |needle: &str| line_of(&text, needle);
    let billing = "autoscaler \"billing\"";
    assert_has(
        &p,
        &format!(
            "rules.toml:{}: {billing}: schedule[0].time_zone (\"Mars/Olympus\") is not an IANA time zone such as \
             \"Europe/Paris\" or \"UTC\"",
            line("Mars/Olympus")
        ),
    );
    assert_has(
        &p,
        &format!(
            "rules.toml:{}: {billing}: schedule[0].days (\"funday\") is not a day: use mon, tue, wed, thu, fri, sat, \
             sun, weekdays, weekends or daily",
            line("funday")
        ),
    );
    assert_has(
        &p,
        &format!(
            "rules.toml:{}: {billing}: schedule[0].start (\"8h\") must be a time of day such as \"08:00\" or \"18:30\"",
            line("\"8h\"")
        ),
    );
    assert_has(
        &p,
        &format!(
            "rules.toml:{}: {billing}: schedule[0].min_replicas (12) must not exceed max_replicas (9)",
            line("= 12")
        ),
    );
    assert_has(
        &p,
        &format!(
            "rules.toml:{}: {billing}: schedule[1].cron cannot be combined with days, start and end: a window is \
             weekly or cron, not both",
            line("0 7 * * mon")
        ),
    );
    assert_has(
        &p,
        &format!(
            "rules.toml:{}: {billing}: schedule[1].max_replicas (1) must not be below min_replicas (2)",
            line("max_replicas = 1")
        ),
    );
    assert!(
        p.iter().any(|l| l.ends_with(
            "schedule[2] needs days, start and end (a weekly window), or cron and duration (a cron window)"
        )),
        "{p:?}"
    );
}

#[test]
fn a_pause_is_an_instant_with_its_offset() {
    let text =
        BILLING.replace("min_replicas = 4\n", "min_replicas = 4\npaused_until = \"2026-12-01T19:00:00+01:00\"\n");
    let rules = parse(&format!("{BACKENDS}{text}"));
    let billing = rules.autoscaler("billing").unwrap();
    let until = Timestamp::from_unix_millis(1_796_148_000_000);
    assert_eq!(billing.paused_until, Some(until), "18:00 UTC");
    assert!(billing.paused_at(Timestamp::from_unix_millis(1_796_147_999_999)));
    assert!(!billing.paused_at(until), "it resumes at the instant named");
    let wrong = BILLING.replace("min_replicas = 4\n", "min_replicas = 4\npaused_until = \"2026-12-01 18:00\"\n");
    let text = format!("{BACKENDS}{wrong}");
    assert_eq!(
        problems(&text),
        [format!(
            "rules.toml:{}: autoscaler \"billing\": paused_until (\"2026-12-01 18:00\") must be an instant such as \
             \"2026-12-01T18:00:00Z\" (RFC 3339, with its offset)",
            line_of(&text, "paused_until")
        )]
    );
}

#[test]
fn an_instant_past_what_the_clock_holds_says_so() {
    for (written, why) in [
        ("9999-12-31T23:59:59Z", "is past the latest instant watermarkd supports (9999-12-30T22:00:00Z)"),
        ("9999-12-31T00:00:00+01:00", "is past the latest instant watermarkd supports (9999-12-30T22:00:00Z)"),
        ("-009999-01-01T00:00:00Z", "is before the earliest instant watermarkd supports (-9999-01-02T01:59:59Z)"),
    ] {
        let text = format!(
            "{BACKENDS}{}",
            BILLING.replace("min_replicas = 4\n", &format!("min_replicas = 4\npaused_until = \"{written}\"\n"))
        );
        assert_eq!(
            problems(&text),
            [format!(
                "rules.toml:{}: autoscaler \"billing\": paused_until ({written:?}) {why}",
                line_of(&text, "paused_until")
            )]
        );
    }
}

#[test]
fn a_pause_that_has_ended_is_a_warning_and_leaves_the_summary() {
    let text = format!(
        "{BACKENDS}{}",
        BILLING.replace("min_replicas = 4\n", "min_replicas = 4\npaused_until = \"2026-11-22T00:00:00Z\"\n")
    );
    let rules = parse(&text);
    let billing = rules.autoscaler("billing").unwrap();
    // NOW is a day after the pause ended.
    assert!(!summary(billing).contains("paused"), "{}", summary(billing));
    assert_eq!(
        warnings_at(billing, NOW),
        ["paused_until (2026-11-22T00:00:00Z) has passed: the autoscaler is not paused (remove the line, or set a time to come)"]
    );
    assert!(warnings(billing).is_empty(), "the daemon's load-time warnings do not depend on the time");
    // A day earlier it was still to come.
    let before = Timestamp::from_unix_millis(NOW.unix_millis() - 2 * 86_400_000);
    assert!(super::super::check::summary(billing, before).ends_with(", paused until 2026-11-22T00:00:00Z"));
    assert!(warnings_at(billing, before).is_empty());
}

#[test]
fn a_fallback_that_would_run_another_count_or_drop_at_once_is_refused() {
    let billing = "autoscaler \"billing\"";
    for (fallback, expected) in [
        (
            "action = \"replicas\"\nreplicas = 2\n",
            "fallback.replicas (2) must not be below min_replicas (4): the fallback would run 4",
        ),
        (
            "after = \"10s\"\naction = \"replicas\"\nreplicas = 6\nscale_down = true\n",
            "fallback.after (10s) must be at least the default interval (15s) with scale_down = true: shorter, one or \
             two failed reads in a row scale down to the count",
        ),
    ] {
        let declared =
            BILLING.replace("min_replicas = 4\n", &format!("min_replicas = 4\n[autoscaler.fallback]\n{fallback}"));
        let text = format!("{BACKENDS}{declared}");
        let p = problems(&text);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].ends_with(&format!("{billing}: {expected}")), "{p:?}");
    }
    // A written interval is the one compared; without scale_down a short `after` only raises.
    let fine = BILLING.replace(
        "min_replicas = 4\n",
        "min_replicas = 4\ninterval = \"5s\"\n[autoscaler.fallback]\nafter = \"10s\"\naction = \"replicas\"\nreplicas = 6\nscale_down = true\n",
    );
    parse(&format!("{BACKENDS}{fine}"));
    let zero = BILLING
        .replace("min_replicas = 4\n", "min_replicas = 4\ninterval = \"1m\"\n[autoscaler.fallback]\nafter = \"0s\"\naction = \"replicas\"\nreplicas = 6\n");
    parse(&format!("{BACKENDS}{zero}"));
    let minute = BILLING.replace(
        "min_replicas = 4\n",
        "min_replicas = 4\ninterval = \"1m\"\n[autoscaler.fallback]\nafter = \"30s\"\naction = \"replicas\"\nreplicas = 6\nscale_down = true\n",
    );
    let p = problems(&format!("{BACKENDS}{minute}"));
    assert!(
        p.len() == 1 && p[0].contains("fallback.after (30s) must be at least the interval (1m) with scale_down"),
        "{p:?}"
    );
}

#[test]
fn a_fallback_says_what_to_do_without_data_and_is_checked() {
    use crate::domain::fallback::FallbackAction;
    let declared = BILLING.replace(
        "min_replicas = 4\n",
        "min_replicas = 4\n[autoscaler.fallback]\nafter = \"10m\"\naction = \"replicas\"\nreplicas = 8\nscale_down = true\n",
    );
    let rules = parse(&format!("{BACKENDS}{declared}"));
    let fallback = rules.autoscaler("billing").unwrap().fallback.as_deref().expect("a fallback");
    assert_eq!(fallback.after, Duration::from_secs(600));
    assert_eq!(fallback.recover_after, Duration::from_secs(120), "the default");
    assert_eq!(fallback.action, FallbackAction::Replicas { replicas: 8, scale_down: true });

    let wrong = BILLING.replace(
        "min_replicas = 4\n",
        "min_replicas = 4\n[autoscaler.fallback]\naction = \"last_good\"\nreplicas = 12\nscale_down = true\n",
    );
    let text = format!("{BACKENDS}{wrong}");
    let billing = "autoscaler \"billing\"";
    assert_eq!(
        problems(&text),
        [
            format!(
                "rules.toml:{}: {billing}: fallback.replicas only applies with action = \"replicas\"",
                line_of(&text, "replicas = 12")
            ),
            format!(
                "rules.toml:{}: {billing}: fallback.scale_down only applies with action = \"replicas\": a count to \
                 scale down to",
                line_of(&text, "scale_down = true")
            ),
        ]
    );
    let too_many = BILLING.replace(
        "min_replicas = 4\n",
        "min_replicas = 4\n[autoscaler.fallback]\naction = \"replicas\"\nreplicas = 12\n",
    );
    let text = format!("{BACKENDS}{too_many}");
    assert_eq!(
        problems(&text),
        [format!(
            "rules.toml:{}: {billing}: fallback.replicas (12) must not exceed max_replicas (9)",
            line_of(&text, "replicas = 12")
        )]
    );
}

#[test]
fn a_forecast_needs_its_lead_time_and_sane_bounds() {
    use crate::domain::forecast::ForecastMode;
    let declared = format!("{BACKENDS}{BILLING}\n[autoscaler.forecast]\nlead_time = \"10m\"\n");
    let rules = parse(&declared);
    let forecast = rules.autoscaler("billing").unwrap().forecast.as_deref().expect("a forecast");
    assert_eq!(forecast.lead_time, Duration::from_secs(600));
    assert_eq!(forecast.mode, ForecastMode::Observe, "it observes until told to scale");
    assert_eq!((forecast.max_error, forecast.max_factor), (0.3, 2.0));
    let text =
        format!("{BACKENDS}{BILLING}\n[autoscaler.forecast]\nmode = \"guess\"\nmax_error = 2\nmax_factor = 0.5\n");
    let p = problems(&text);
    let billing = "autoscaler \"billing\"";
    for expected in [
        format!("rules.toml:{}: {billing}: forecast.lead_time is required", line_of(&text, "[autoscaler.forecast]")),
        format!(
            "rules.toml:{}: {billing}: forecast.mode (\"guess\") must be \"observe\" or \"scale\"",
            line_of(&text, "guess")
        ),
        format!(
            "rules.toml:{}: {billing}: forecast.max_error (2) must be a fraction above 0 and at most 1, e.g. 0.3",
            line_of(&text, "max_error")
        ),
        format!(
            "rules.toml:{}: {billing}: forecast.max_factor (0.5) must be from 1 to 100",
            line_of(&text, "max_factor")
        ),
    ] {
        assert_has(&p, &expected);
    }
}
