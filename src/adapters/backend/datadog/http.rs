//! One request's exchange with Datadog: the keys as sensitive headers, the GET with retries
//! on a jittered backoff within the cycle's deadline, the body read within its bound, the
//! failure classified, the rate-limit headers noted, and both keys scrubbed from every text
//! that leaves.

use super::*;
use crate::domain::status::backends::RateLimitSeen;

/// Why a request failed, for every query it carried.
#[derive(Clone, Debug)]
pub(super) struct Failure {
    pub(super) error: QueryError,
    pub(super) outcome: RequestOutcome,
    pub(super) retryable: bool,
    pub(super) status: Option<u16>,
}

/// Both keys as request headers, marked sensitive (out of reqwest's and hyper's debug output);
/// which key cannot be a header value otherwise.
pub(super) fn key_headers(api_key: &Secret, app_key: &Secret) -> Result<HeaderMap, &'static str> {
    let mut headers = HeaderMap::new();
    for (header, key, what) in [(API_KEY_HEADER, api_key, "API key"), (APP_KEY_HEADER, app_key, "application key")] {
        let mut value = HeaderValue::from_str(key.expose()).map_err(|_| what)?;
        value.set_sensitive(true);
        headers.insert(HeaderName::from_static(header), value);
    }
    Ok(headers)
}

impl Inner {
    /// One request of `layout.len()` sub-queries; one observation per sub-query, or per member
    /// of a grouped one (`parse::SubQuery`).
    pub(super) async fn send_v1(
        &self,
        url: &str,
        layout: &[SubQuery],
        cx: CycleContext,
    ) -> Result<Vec<Observation>, Failure> {
        let queries = layout.len();
        let context = V1Context { queries, layout, now: cx.now, max_age: self.max_age, site: &self.place };
        let read =
            |status: u16, rate: &RateLimitHeaders, body: &[u8]| match read_v1_answer(status, rate, body, &context) {
                V1Answer::Answered(observations) => Ok(observations),
                V1Answer::Failed { error, outcome, retryable } => {
                    Err(Failure { error, outcome, retryable, status: Some(status) })
                }
            };
        tracing::debug!(backend = %self.name, queries, url_chars = url.len(), "Datadog query");
        self.exchange(self.keyed_get(url).await, cx.started, cx.deadline, read).await
    }

    /// A GET of `url` with both keys as they are now, for `exchange` to build once per attempt.
    pub(super) async fn keyed_get<'a>(&'a self, url: &'a str) -> impl Fn() -> reqwest::RequestBuilder + 'a {
        let (api_key, app_key) = (self.api_key.current().await, self.app_key.current().await);
        // A rotated key that cannot be a header value is sent as none: Datadog's 403 then says
        // to check the keys, which is the advice needed.
        let keys = key_headers(&api_key, &app_key).unwrap_or_default();
        move || self.http.get(url).headers(keys.clone())
    }

    /// Sends one request, retrying what is worth retrying until the deadline (however many
    /// attempts that is). Every answer's headers feed the pacer, and a 429 blocks everything.
    /// `started`: when the cycle began, for the timeout's text.
    pub(super) async fn exchange<T>(
        &self,
        request: impl Fn() -> reqwest::RequestBuilder,
        started: Instant,
        deadline: Instant,
        read: impl Fn(u16, &RateLimitHeaders, &[u8]) -> Result<T, Failure>,
    ) -> Result<T, Failure> {
        let timed_out = |after: Duration| Failure {
            error: QueryError::Timeout(ceil_secs(after)),
            outcome: RequestOutcome::Timeout,
            retryable: false,
            status: None,
        };
        // Waiting for a slot counts against the cycle: a request that cannot start before the
        // deadline is not sent at all.
        // Held until the request is done, through its backoff sleeps: a failing server gets no
        // more concurrent load from retries.
        let _permit = match tokio::time::timeout_at(deadline, self.permits.acquire()).await {
            Ok(Ok(permit)) => permit,
            // The semaphore is never closed; were it, there would be nothing left to wait for.
            Ok(Err(_)) => {
                return Err(Failure {
                    error: QueryError::Transport("the client is shutting down".into()),
                    outcome: RequestOutcome::Transport,
                    retryable: false,
                    status: None,
                })
            }
            Err(_) => return Err(timed_out(deadline.saturating_duration_since(started))),
        };
        let mut backoff = BACKOFF.build();
        let mut last: Option<Failure> = None;
        loop {
            if let Some(reset_in_seconds) = lock(&self.pacer).blocked(Instant::now()) {
                return Err(Failure {
                    error: QueryError::RateLimited { reset_in_seconds },
                    outcome: RequestOutcome::RateLimited,
                    retryable: false,
                    status: None,
                });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left < MIN_ATTEMPT {
                return Err(last.unwrap_or_else(|| timed_out(deadline.saturating_duration_since(started))));
            }
            let result = self.attempt(&request, self.timeout.min(left), &read).await;
            let failure = match result {
                Ok(value) => return Ok(value),
                Err(failure) if failure.retryable => failure,
                Err(failure) => return Err(failure),
            };
            let Some(delay) = backoff.next() else { return Err(failure) };
            if Instant::now() + delay + MIN_ATTEMPT >= deadline {
                return Err(failure);
            }
            // A retry is a request the cycle was not admitted for: it comes out of the reserve.
            if !lock(&self.pacer).take_extra(Instant::now(), 1) {
                return Err(failure);
            }
            tracing::debug!(backend = %self.name, error = %self.scrub_error(failure.error.clone()), ?delay, "retrying");
            last = Some(failure);
            tokio::time::sleep(delay).await;
        }
    }

    /// One HTTP request: sends, reads the whole body, records headers, latency and outcome.
    pub(super) async fn attempt<T>(
        &self,
        request: &impl Fn() -> reqwest::RequestBuilder,
        timeout: Duration,
        read: &impl Fn(u16, &RateLimitHeaders, &[u8]) -> Result<T, Failure>,
    ) -> Result<T, Failure> {
        let started = Instant::now();
        let until = body::until(timeout);
        let result = match request().timeout(timeout).send().await {
            Ok(mut response) => {
                let status = response.status().as_u16();
                let rate = RateLimitHeaders::from_header_map(response.headers());
                self.note_rate(&rate, status != 429);
                if status == 429 {
                    let wait = rate_limit_wait(&rate);
                    lock(&self.pacer).rate_limited(Instant::now(), wait);
                    tracing::warn!(
                        backend = %self.name,
                        wait_seconds = wait.as_secs(),
                        "Datadog answered 429 (rate limited): no query requests until the budget resets"
                    );
                }
                match self.read_body(&mut response, timeout, until).await {
                    // Parsed while the body holds its share of the budget.
                    Ok(body) => read(status, &rate, &body.bytes),
                    Err(failure) => Err(failure),
                }
            }
            Err(err) => Err(self.http_failure(err, timeout)),
        };
        let outcome = match &result {
            Ok(_) => RequestOutcome::Ok,
            Err(failure) => failure.outcome,
        };
        let name = self.name.as_str();
        self.metrics.request_seconds.with_label_values(&[name]).observe(started.elapsed().as_secs_f64());
        self.metrics.request_ended(name, outcome.label());
        let forbidden = outcome == RequestOutcome::Forbidden;
        if self.forbidden.swap(forbidden, Ordering::Relaxed) != forbidden {
            if forbidden {
                tracing::warn!(
                    backend = %self.name,
                    "Datadog refused the keys (HTTP 403): check the API key, the application key's \
                     `timeseries_query` scope and the site"
                );
            } else {
                tracing::info!(backend = %self.name, "Datadog no longer refuses the keys");
            }
        }
        result
    }

    /// The whole body, within the client's budget for bodies (`body`): an answer beyond
    /// `MAX_BODY_BYTES` is refused once the cap is passed (or as soon as it announces more)
    /// instead of filling memory, and a large one waits for the others to be parsed. Not
    /// retried when too large: the same query would bring the same answer, and its budget with
    /// it.
    pub(super) async fn read_body(
        &self,
        response: &mut reqwest::Response,
        timeout: Duration,
        until: Instant,
    ) -> Result<body::Body<'_>, Failure> {
        match self.bodies.read(response, until).await {
            Ok(body) => Ok(body),
            Err(BodyError::Transport(err)) => Err(self.http_failure(err, timeout)),
            Err(BodyError::TimedOut) => Err(Failure {
                error: QueryError::Timeout(ceil_secs(timeout)),
                outcome: RequestOutcome::Timeout,
                retryable: true,
                status: None,
            }),
            Err(BodyError::TooLarge) => Err(Failure {
                error: QueryError::Protocol(format!(
                    "Datadog's answer is larger than {} MiB, so it was not read: the request's queries return \
                     far more series or points than an autoscaler needs (group or filter them, or shorten \
                     `window`)",
                    MAX_BODY_BYTES / (1024 * 1024)
                )),
                outcome: RequestOutcome::Protocol,
                retryable: false,
                // Whatever the status said: an oversized 400 is not a reason to split the batch.
                status: None,
            }),
        }
    }

    pub(super) fn http_failure(&self, err: reqwest::Error, timeout: Duration) -> Failure {
        if err.is_timeout() {
            return Failure {
                error: QueryError::Timeout(ceil_secs(timeout)),
                outcome: RequestOutcome::Timeout,
                retryable: true,
                status: None,
            };
        }
        // The chain without the URL (long, and useless next to the backend's name): "error
        // sending request: client error (Connect): tcp connect error: Connection refused".
        let refused_redirect = crate::adapters::backend::trust::is_refused_redirect(&err);
        let err = err.without_url();
        let mut text = String::new();
        let mut source: Option<&dyn std::error::Error> = Some(&err);
        while let Some(e) = source {
            let part = e.to_string();
            if !text.contains(&part) {
                if !text.is_empty() {
                    text.push_str(": ");
                }
                text.push_str(&part);
            }
            source = e.source();
        }
        // A redirect elsewhere is the URL's problem: asking again gets the same answer.
        if refused_redirect {
            return Failure {
                error: QueryError::Configuration(self.scrub_text(&text)),
                outcome: RequestOutcome::Transport,
                retryable: false,
                status: None,
            };
        }
        Failure {
            error: QueryError::Transport(self.scrub_text(&text)),
            outcome: RequestOutcome::Transport,
            retryable: true,
            status: None,
        }
    }

    pub(super) fn note_rate(&self, rate: &RateLimitHeaders, counted: bool) {
        if rate.is_empty() {
            return;
        }
        lock(&self.pacer).observe(Instant::now(), rate, counted);
        let seen = RateLimitSeen { limit: rate.limit, remaining: rate.remaining, reset_seconds: rate.reset };
        self.metrics.rate_limit_seen(&self.name, seen);
    }

    /// Sets the stretched-interval gauge after an admission decision, logging real changes.
    pub(super) fn report_stretch(&self) {
        let (value, changed) = lock(&self.pacer).stretch_to_log();
        self.metrics.stretched_interval(&self.name, value);
        match changed {
            Some(0) => tracing::warn!(
                backend = %self.name,
                "Datadog rate budget: the configured intervals fit again, no cycle is deferred"
            ),
            Some(seconds) => tracing::warn!(
                backend = %self.name,
                stretched_interval_seconds = seconds,
                "Datadog rate budget: cycles are stretched to one every {seconds}s; queries asked for sooner are \
                 deferred (fewer or longer-interval autoscalers, or a larger budget, would avoid it)"
            ),
            None => {}
        }
    }

    pub(super) fn scrub_text(&self, text: &str) -> String {
        let mut text = text.to_string();
        for key in [self.api_key.cached(), self.app_key.cached()] {
            let value = key.expose();
            if !value.is_empty() && text.contains(value) {
                text = text.replace(value, "[redacted]");
            }
        }
        text
    }

    pub(super) fn scrub_error(&self, error: QueryError) -> QueryError {
        let s = |text: String| self.scrub_text(&text);
        match error {
            QueryError::Configuration(t) => QueryError::Configuration(s(t)),
            QueryError::BadQuery(t) => QueryError::BadQuery(s(t)),
            QueryError::NoData(t) => QueryError::NoData(s(t)),
            QueryError::NotANumber(t) => QueryError::NotANumber(s(t)),
            QueryError::Server(t) => QueryError::Server(s(t)),
            QueryError::Transport(t) => QueryError::Transport(s(t)),
            QueryError::Protocol(t) => QueryError::Protocol(s(t)),
            other => other,
        }
    }

    /// Removes the keys from an observation's texts, should a server or proxy ever echo them.
    pub(super) fn scrub(&self, mut observation: Observation) -> Observation {
        match observation.detail.error.take() {
            Some(error) => Observation::unavailable_with(self.scrub_error(error), observation.detail),
            None => observation,
        }
    }
}
