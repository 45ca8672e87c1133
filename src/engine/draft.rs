//! Speculative drafts: guesses of a sequence's next tokens that the scheduler verifies in one
//! forward pass of the target model, keeping only those equal to what plain decoding picks.
//!
//! A draft comes from prompt lookup ([`lookup`]: the tokens that followed the latest earlier
//! occurrence of the sequence's last n-gram, over the prompt and the reply so far) or from a
//! smaller model with the same vocabulary ([`DraftModel`], its own KV per sequence, rolled back
//! to what was accepted). This module proposes tokens and counts what was accepted; it never
//! decides a token: the scheduler samples every output token from the target's own row, so a
//! draft changes how many positions one pass verifies, never which tokens come out.

use std::sync::Arc;

use super::kv::{KvLayout, KvStorage, SeqKv};
use super::sampling::Sampler;
use super::SamplingParams;
use crate::model::kv::{KvSeq, Logits, SeqStep};
use crate::model::runner::Model;
use crate::model::transformer::Scratch;
use crate::model::ModelError;

/// Where drafts come from.
#[derive(Clone)]
pub enum DraftSource {
    /// N-gram lookup over the prompt and the reply so far (no second model).
    Lookup,
    /// A smaller model with the target's vocabulary.
    Model(Arc<Model>),
}

impl std::fmt::Debug for DraftSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DraftSource::Lookup => write!(f, "Lookup"),
            DraftSource::Model(_) => write!(f, "Model"),
        }
    }
}

/// How many tokens to draft, and when drafting is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftConfig {
    /// Most tokens drafted per sequence and step.
    pub tokens: usize,
    /// Shrink a sequence's draft after rejections and grow it back after full acceptances.
    pub adaptive: bool,
    /// Drafting is off for a step with more decoding sequences than this: verification then
    /// costs more than it saves (decode is no longer bound by reading the weights).
    pub max_batch: usize,
}

/// Default tokens per draft.
pub const DEFAULT_DRAFT_TOKENS: usize = 8;
/// Default largest decoding batch that drafts.
pub const DEFAULT_DRAFT_MAX_BATCH: usize = 4;

impl Default for DraftConfig {
    fn default() -> Self {
        DraftConfig {
            tokens: DEFAULT_DRAFT_TOKENS,
            adaptive: true,
            max_batch: DEFAULT_DRAFT_MAX_BATCH,
        }
    }
}

/// Drafted and accepted tokens so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DraftStats {
    /// Sequence steps that verified at least one drafted token.
    pub verify_steps: u64,
    /// Tokens drafted in those steps.
    pub drafted: u64,
    /// Drafted tokens equal to the target's own pick.
    pub accepted: u64,
    /// Output tokens those steps produced (accepted drafts plus the target's own token).
    pub tokens: u64,
    /// Steps in which drafting was off because the batch was larger than the limit.
    pub skipped_steps: u64,
    /// Microseconds spent making drafts (the draft model's passes; lookup's search).
    pub draft_us: u64,
}

impl DraftStats {
    pub fn add(&mut self, o: DraftStats) {
        self.verify_steps += o.verify_steps;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
        self.tokens += o.tokens;
        self.skipped_steps += o.skipped_steps;
        self.draft_us += o.draft_us;
    }

    /// Accepted over drafted tokens (0 when nothing was drafted).
    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }

    /// Output tokens per verifying step of one sequence (1 would be plain decoding).
    pub fn tokens_per_step(&self) -> f64 {
        if self.verify_steps == 0 {
            0.0
        } else {
            self.tokens as f64 / self.verify_steps as f64
        }
    }

    /// One line for logs and notes.
    pub fn summary(&self) -> String {
        format!(
            "{} verify steps, {} drafted, {} accepted ({:.1}%), {:.2} tokens per verify step, \
             {:.1} ms drafting",
            self.verify_steps,
            self.drafted,
            self.accepted,
            100.0 * self.acceptance_rate(),
            self.tokens_per_step(),
            self.draft_us as f64 / 1e3
        )
    }
}

/// Longest n-gram matched by [`lookup`].
pub const LOOKUP_MAX_NGRAM: usize = 4;
/// Shortest n-gram matched by [`lookup`].
pub const LOOKUP_MIN_NGRAM: usize = 2;

/// Prompt lookup: for the longest suffix of `history` (from [`LOOKUP_MAX_NGRAM`] down to
/// [`LOOKUP_MIN_NGRAM`] tokens) that also occurs earlier in `history`, the (up to `k`) tokens
/// that followed its latest earlier occurrence. Empty when no suffix recurs.
pub fn lookup(history: &[u32], k: usize) -> Vec<u32> {
    let len = history.len();
    if k == 0 {
        return Vec::new();
    }
    for n in (LOOKUP_MIN_NGRAM..=LOOKUP_MAX_NGRAM).rev() {
        if len <= n {
            continue;
        }
        let tail = &history[len - n..];
        // Latest start `s < len - n` with history[s..s+n] == tail.
        for s in (0..len - n).rev() {
            if &history[s..s + n] == tail {
                let from = s + n;
                let to = (from + k).min(len);
                return history[from..to].to_vec();
            }
        }
    }
    Vec::new()
}

/// Per-sequence drafting state kept by the scheduler.
#[derive(Debug)]
pub struct SeqDraft {
    /// Tokens to draft next time (adaptive).
    pub k: usize,
    /// The draft model's KV for this sequence (positions of the sequence's accepted tokens).
    pub kv: Option<SeqKv>,
    /// The recent share of drafted tokens accepted (an average over verify steps, recent ones
    /// weighing most), from 0.5 before any.
    pub acceptance: f64,
}

impl SeqDraft {
    pub fn new(k: usize) -> SeqDraft {
        SeqDraft {
            k,
            kv: None,
            acceptance: 0.5,
        }
    }

    /// After a verify step that drafted `drafted` tokens and accepted `accepted`: the next
    /// draft's length (at most `max`). It grows by 2 after a full acceptance and falls to one
    /// past the accepted tokens after a rejection; with `row_cost` (a verified row's time
    /// over a step's fixed time, [`StepCosts::row_cost`]) it is at most the length that
    /// yields most tokens per unit of time at the recent acceptance ([`best_draft_len`]).
    pub fn adapt(&mut self, drafted: usize, accepted: usize, max: usize, row_cost: Option<f64>) {
        if drafted > 0 {
            self.acceptance = 0.6 * self.acceptance + 0.4 * (accepted as f64 / drafted as f64);
        }
        let by_outcome = if accepted == drafted {
            (self.k + 2).min(max)
        } else {
            (accepted + 1).min(max)
        };
        let cap = row_cost.map_or(max, |r| best_draft_len(self.acceptance, r, max));
        self.k = by_outcome.min(cap).max(1);
    }

    /// Forgets the draft model's positions from `len` on (the rejected drafts).
    pub fn rollback(&mut self, len: usize) {
        if let Some(kv) = &mut self.kv {
            kv.truncate(len);
        }
    }
}

/// The draft length from 1 to `max` that yields most tokens per unit of time when each
/// drafted token is accepted with probability `alpha` (until the first rejection) and a
/// verify step of `k + 1` rows costs `1 + row_cost · (k + 1)` (a step's fixed time is 1).
/// Tokens do not depend on it (a verify keeps exactly the plain tokens), only speed.
pub fn best_draft_len(alpha: f64, row_cost: f64, max: usize) -> usize {
    let alpha = alpha.clamp(0.0, 1.0);
    let rate = |k: usize| {
        let tokens = if alpha >= 1.0 {
            (k + 1) as f64
        } else {
            (1.0 - alpha.powi(k as i32 + 1)) / (1.0 - alpha)
        };
        tokens / (1.0 + row_cost * (k + 1) as f64)
    };
    (1..=max.max(1))
        .fold((1, f64::MIN), |(bk, br), k| {
            let r = rate(k);
            if r > br + 1e-12 {
                (k, r)
            } else {
                (bk, br)
            }
        })
        .0
}

/// Step time against rows in decode steps, by the number of sequences in the step: `t ≈ a +
/// b · rows`, a least-squares line over the recent steps (older ones weigh less). Measured
/// on the machine as it runs, so drafting's length follows what a verified row really costs.
#[derive(Debug, Default)]
pub struct StepCosts {
    fits: std::collections::HashMap<usize, Fit>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Fit {
    n: f64,
    sx: f64,
    sy: f64,
    sxx: f64,
    sxy: f64,
}

/// Weight kept by older steps at each new one.
const COST_DECAY: f64 = 0.97;

impl StepCosts {
    /// A decode step of `seqs` sequences and `rows` rows in all took `secs`.
    pub fn observe(&mut self, seqs: usize, rows: usize, secs: f64) {
        let f = self.fits.entry(seqs).or_default();
        let (x, y) = (rows as f64, secs);
        *f = Fit {
            n: f.n * COST_DECAY + 1.0,
            sx: f.sx * COST_DECAY + x,
            sy: f.sy * COST_DECAY + y,
            sxx: f.sxx * COST_DECAY + x * x,
            sxy: f.sxy * COST_DECAY + x * y,
        };
    }

    /// `b / a` for steps of `seqs` sequences: a verified row's time over the step's fixed
    /// time. `None` until steps of at least two row counts were seen.
    pub fn row_cost(&self, seqs: usize) -> Option<f64> {
        let f = self.fits.get(&seqs)?;
        let var = f.sxx * f.n - f.sx * f.sx;
        if f.n < 2.0 || var <= 1e-9 * f.n * f.n {
            return None;
        }
        let b = (f.sxy * f.n - f.sx * f.sy) / var;
        let a = (f.sy - b * f.sx) / f.n;
        (a > 0.0).then(|| (b / a).max(0.0))
    }
}

/// One sequence's request to the draft model: its known tokens (prompt and reply so far,
/// ending with the token about to be fed to the target), how many to draft, and how it samples.
pub struct DraftAsk<'a> {
    pub history: &'a [u32],
    pub state: &'a mut SeqDraft,
    pub k: usize,
    pub params: &'a SamplingParams,
    /// The output position of the first drafted token.
    pub step: u64,
}

/// A draft model: its weights and the buffers of its forward passes. Sequences' KV live in
/// their [`SeqDraft`].
pub struct DraftModel {
    model: Arc<Model>,
    scratch: Scratch,
    sampler: Sampler,
    chunk: usize,
}

impl DraftModel {
    pub fn new(model: Arc<Model>, chunk: usize) -> DraftModel {
        DraftModel {
            model,
            scratch: Scratch::default(),
            sampler: Sampler::default(),
            chunk: chunk.max(1),
        }
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    fn new_kv(&self) -> SeqKv {
        SeqKv::new_in(
            KvLayout::of(self.model.transformer()),
            KvStorage::for_model(&self.model),
        )
    }

    /// Drafts for every ask, batched: first the draft model catches up with each history
    /// (chunked), then it decodes up to `k` tokens per sequence, sampling each with the
    /// request's own parameters and output position (the same random stream the target's
    /// sampling uses, so a close draft model often picks the same token). A draft stops early
    /// at the context's end; on a device whose KV pool is short, a sequence drafts nothing.
    pub fn propose(&mut self, asks: &mut [DraftAsk<'_>]) -> Result<Vec<Vec<u32>>, ModelError> {
        let ctx = self.model.config().context_len;
        let vocab = self.model.config().vocab_size;
        let mut out: Vec<Vec<u32>> = vec![Vec::new(); asks.len()];
        // Per ask: how many tokens it drafts (0: none), and what it feeds next.
        let mut want = vec![0usize; asks.len()];
        for (i, a) in asks.iter_mut().enumerate() {
            let fresh = self.new_kv();
            let kv = a.state.kv.get_or_insert(fresh);
            if kv.len() >= a.history.len() {
                // Never expected (the last token is always new), but then start over.
                kv.truncate(0);
            }
            let k = a.k.min(ctx.saturating_sub(a.history.len()));
            let grow = a.history.len() - kv.len() + k;
            let short = kv
                .storage()
                .free_blocks()
                .is_some_and(|free| free < kv.blocks_to_grow(grow));
            if !short {
                want[i] = k;
            }
        }
        // Catch up: all but each history's last chunk, without logits.
        loop {
            let mut steps = Vec::new();
            for (a, _) in asks.iter_mut().zip(&want).filter(|(_, &w)| w > 0) {
                let kv = a.state.kv.as_mut().expect("set above");
                let from = kv.len();
                if a.history.len() - from > self.chunk {
                    steps.push(SeqStep {
                        tokens: &a.history[from..from + self.chunk],
                        kv,
                        logits: Logits::None,
                    });
                }
            }
            if steps.is_empty() {
                break;
            }
            self.model.forward(&mut steps, &mut self.scratch)?;
        }
        // The last chunk gives each sequence's first draft; then one token per pass.
        let mut feed: Vec<Vec<u32>> = asks
            .iter()
            .map(|a| {
                let from = a.state.kv.as_ref().map_or(0, |kv| kv.len());
                a.history[from..].to_vec()
            })
            .collect();
        let mut round = 0u64;
        loop {
            let live: Vec<usize> = (0..asks.len())
                .filter(|&i| out[i].len() < want[i])
                .collect();
            if live.is_empty() {
                break;
            }
            let mut steps = Vec::with_capacity(live.len());
            for ((a, f), _) in asks
                .iter_mut()
                .zip(&feed)
                .zip(0..)
                .filter(|(_, i)| live.contains(i))
            {
                steps.push(SeqStep {
                    tokens: f,
                    kv: a.state.kv.as_mut().expect("set above"),
                    logits: Logits::Last,
                });
            }
            let logits = self.model.forward(&mut steps, &mut self.scratch)?;
            drop(steps);
            for (r, &i) in live.iter().enumerate() {
                let a = &asks[i];
                let row = &logits[r * vocab..(r + 1) * vocab];
                let tok = self.sampler.sample(row, a.params, a.step + round);
                out[i].push(tok);
                feed[i] = vec![tok];
            }
            round += 1;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_copies_what_followed_the_latest_match() {
        // "1 2 3 4 5 ... 1 2 3" → 4 5 (the 3-gram 1 2 3 recurs).
        let h = [1, 2, 3, 4, 5, 9, 9, 1, 2, 3];
        assert_eq!(lookup(&h, 2), vec![4, 5]);
        assert_eq!(lookup(&h, 10), vec![4, 5, 9, 9, 1, 2, 3]);
        // The latest earlier occurrence wins.
        let h = [7, 8, 1, 7, 8, 2, 7, 8];
        assert_eq!(lookup(&h, 1), vec![2]);
        // No recurring 2-gram: nothing.
        assert_eq!(lookup(&[1, 2, 3, 4], 4), Vec::<u32>::new());
        assert_eq!(lookup(&[1, 2, 1, 2], 0), Vec::<u32>::new());
        assert_eq!(lookup(&[], 3), Vec::<u32>::new());
    }

    #[test]
    fn lookup_prefers_the_longest_ngram() {
        // 2-gram "5 6" last followed by 0, but the 3-gram "4 5 6" by 7.
        let h = [4, 5, 6, 7, 1, 5, 6, 0, 4, 5, 6];
        assert_eq!(lookup(&h, 1), vec![7]);
    }

    #[test]
    fn adapt_grows_on_full_acceptance_and_shrinks_on_rejection() {
        let mut s = SeqDraft::new(4);
        s.adapt(4, 4, 8, None);
        assert_eq!(s.k, 6);
        s.adapt(6, 6, 8, None);
        assert_eq!(s.k, 8);
        s.adapt(8, 1, 8, None);
        assert_eq!(s.k, 2);
        s.adapt(2, 0, 8, None);
        assert_eq!(s.k, 1);
    }

    /// With a verified row costing 0.28 of a step's fixed time (the default model at batch
    /// 1 on 2 cores: a 9-row verify took 2.77 decode steps) and acceptance 0.72, 3 drafted
    /// tokens yield most per unit of time (1.58× plain against 1.23× for 8); a free row or
    /// full acceptance allow the longest draft; a costly row and poor acceptance the shortest.
    #[test]
    fn the_draft_length_follows_the_cost_of_a_row_and_the_acceptance() {
        assert_eq!(best_draft_len(0.72, 0.28, 8), 3);
        assert_eq!(best_draft_len(0.72, 0.0, 8), 8);
        assert_eq!(best_draft_len(1.0, 0.28, 8), 8);
        assert_eq!(best_draft_len(0.3, 1.0, 8), 1);
        assert_eq!(best_draft_len(0.9, 0.28, 0), 1);
        // Capped by the cost after full acceptances at 0.72: grows to the cap, not past it.
        let mut s = SeqDraft::new(2);
        s.acceptance = 0.72;
        s.adapt(2, 1, 8, Some(0.28));
        assert!(s.k <= 3, "{}", s.k);
        // A run of full acceptances lifts the recent acceptance and with it the cap.
        for _ in 0..8 {
            let k = s.k;
            s.adapt(k, k, 8, Some(0.28));
        }
        assert_eq!(s.k, 8);
    }

    /// The fitted line recovers a step time of 10 ms + 2.8 ms per row from decode steps of
    /// 1 and 9 rows, per number of sequences; one row count alone gives no slope.
    #[test]
    fn step_costs_fit_the_time_per_row() {
        let mut c = StepCosts::default();
        for _ in 0..5 {
            c.observe(1, 1, 0.0128);
        }
        assert_eq!(c.row_cost(1), None, "one row count");
        for i in 0..20 {
            let rows = if i % 2 == 0 { 1 } else { 9 };
            c.observe(1, rows, 0.010 + 0.0028 * rows as f64);
        }
        let r = c.row_cost(1).expect("a slope");
        assert!((r - 0.28).abs() < 1e-6, "{r}");
        assert_eq!(c.row_cost(2), None, "another batch");
    }

    #[test]
    fn stats_rates() {
        let s = DraftStats {
            verify_steps: 4,
            drafted: 10,
            accepted: 6,
            tokens: 10,
            skipped_steps: 0,
            draft_us: 0,
        };
        assert!((s.acceptance_rate() - 0.6).abs() < 1e-12);
        assert!((s.tokens_per_step() - 2.5).abs() < 1e-12);
        assert_eq!(DraftStats::default().acceptance_rate(), 0.0);
    }
}
