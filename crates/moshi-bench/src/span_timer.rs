//! A `tracing` layer that adds up the time spent inside spans, by span name.
//!
//! The model marks its stages with spans (`lm_temporal_layer` around every temporal layer, for
//! example). `moshi-rs bench` installs this layer next to the optional Chrome trace writer and
//! reads the totals after every frame, which is how a `--layers N` run measures the time of one
//! temporal layer without timers inside the model.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::span;
use tracing::Subscriber;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Time spent in spans of one name since the last [`SpanTotals::take`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SpanTotal {
    /// Entered time, summed over every span of the name (nested spans of the same name count twice).
    pub busy: Duration,
    /// How many times a span of this name was exited.
    pub count: u64,
}

/// Shared accumulator filled by [`SpanTimerLayer`].
#[derive(Clone, Debug, Default)]
pub struct SpanTotals {
    inner: Arc<Mutex<HashMap<&'static str, SpanTotal>>>,
}

impl SpanTotals {
    /// Returns the totals gathered so far and starts again from zero.
    pub fn take(&self) -> HashMap<&'static str, SpanTotal> {
        std::mem::take(&mut *self.inner.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn add(&self, name: &'static str, busy: Duration) {
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let e = map.entry(name).or_default();
        e.busy += busy;
        e.count += 1;
    }
}

/// The layer: records enter/exit times of every span whose name is in the watched list.
#[derive(Clone, Debug)]
pub struct SpanTimerLayer {
    watched: Vec<&'static str>,
    totals: SpanTotals,
}

/// Start time of the current entry of a span, kept in the span's extensions.
struct EnteredAt(Instant);

impl SpanTimerLayer {
    /// A layer timing spans named one of `watched` (others are ignored, at no cost beyond a
    /// name comparison), and the handle to read its totals.
    pub fn new(watched: &[&'static str]) -> (Self, SpanTotals) {
        let totals = SpanTotals::default();
        (
            Self {
                watched: watched.to_vec(),
                totals: totals.clone(),
            },
            totals,
        )
    }

    fn watches(&self, name: &str) -> bool {
        self.watched.contains(&name)
    }
}

impl<S> Layer<S> for SpanTimerLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_enter(&self, id: &span::Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if self.watches(span.name()) {
                span.extensions_mut().replace(EnteredAt(Instant::now()));
            }
        }
    }

    fn on_exit(&self, id: &span::Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if self.watches(span.name()) {
                if let Some(EnteredAt(start)) = span.extensions_mut().remove::<EnteredAt>() {
                    self.totals.add(span.metadata().name(), start.elapsed());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn sums_watched_spans_and_ignores_others() {
        let (layer, totals) = SpanTimerLayer::new(&["work"]);
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..3 {
                let _g = tracing::trace_span!("work").entered();
                std::thread::sleep(Duration::from_millis(2));
            }
            let _other = tracing::trace_span!("other").entered();
        });
        let t = totals.take();
        let work = t.get("work").copied().expect("work spans were timed");
        assert_eq!(work.count, 3);
        assert!(
            work.busy >= Duration::from_millis(6),
            "busy {:?}",
            work.busy
        );
        assert!(!t.contains_key("other"));
        assert!(totals.take().is_empty(), "take() starts again from zero");
    }
}
