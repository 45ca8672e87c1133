//! Where the runner gets its models: the [`Models`] trait, and [`FnModels`], which builds one
//! from a loading function (how the engine is plugged in).
//!
//! The runner holds one generator at a time and drops it before loading the next, so only one
//! model is in memory. A `Models` also says which actors share a model (no reload between
//! them) and which engine errors concern a request rather than the engine (the request is
//! logged as a failed step instead of stopping the run). Loading itself (files, weights,
//! devices) is the engine's business, not this module's.

use super::BoxError;
use crate::bench::plan::Actor;
use crate::engine::{ChatRequest, Generate};

/// Where the runner gets a model for an actor.
pub trait Models {
    type Gen: Generate;

    /// Loads the model that answers `actor`'s steps.
    fn load(&mut self, actor: Actor) -> Result<Self::Gen, BoxError>;

    /// Whether `a` and `b` are answered by the same model, so that a loaded generator can be
    /// kept when the actor changes.
    fn same_model(&self, _a: Actor, _b: Actor) -> bool {
        false
    }

    /// Whether `err` concerns the requests themselves (e.g. an empty or over-long prompt)
    /// rather than the engine. The runner then retries the requests one by one and logs the
    /// ones that still fail as failed steps; any other error stops the run.
    fn is_request_error(&self, _err: &<Self::Gen as Generate>::Error) -> bool {
        false
    }

    /// Checks one request before it is generated: `Err(reason)` when the model cannot take it
    /// (its chat template raises, its tokenizer fails, its prompt leaves no room in the
    /// context). The runner logs such a request as a failed step and generates the others.
    fn preflight(&self, _gen: &Self::Gen, _request: &ChatRequest) -> Result<(), String> {
        Ok(())
    }
}

/// A [`Models`] made of a model name per actor and a function that loads a name.
///
/// Actors with equal names share one loaded model. `is_request_error` classifies the
/// generator's errors (default: none is a request error).
pub struct FnModels<G: Generate, L> {
    candidates: Vec<String>,
    judge: String,
    /// Judges 1.. of a panel ([`Actor::Panel`]); judge 0 is `judge`.
    panel: Vec<String>,
    loader: L,
    request_error: fn(&G::Error) -> bool,
    preflight: fn(&G, &ChatRequest) -> Result<(), String>,
}

impl<G, L> FnModels<G, L>
where
    G: Generate,
    L: FnMut(&str) -> Result<G, BoxError>,
{
    pub fn new(candidates: Vec<String>, judge: String, loader: L) -> Self {
        FnModels {
            candidates,
            judge,
            panel: Vec::new(),
            loader,
            request_error: |_| false,
            preflight: |_, _| Ok(()),
        }
    }

    /// Sets the judges after the first of a panel: `names[j - 1]` answers `Actor::Panel(j)`.
    pub fn with_panel(mut self, names: Vec<String>) -> Self {
        self.panel = names;
        self
    }

    /// Sets the check run on every request before it is generated.
    pub fn with_preflight(mut self, check: fn(&G, &ChatRequest) -> Result<(), String>) -> Self {
        self.preflight = check;
        self
    }

    /// Sets the classifier of request-level errors.
    pub fn with_request_errors(mut self, classify: fn(&G::Error) -> bool) -> Self {
        self.request_error = classify;
        self
    }

    /// The model name of `actor`, if the run has one.
    pub fn name(&self, actor: Actor) -> Option<&str> {
        match actor {
            Actor::Candidate(i) => self.candidates.get(i).map(String::as_str),
            Actor::Judge => Some(&self.judge),
            Actor::Panel(j) => j
                .checked_sub(1)
                .and_then(|i| self.panel.get(i))
                .map(String::as_str),
        }
    }
}

impl<G, L> Models for FnModels<G, L>
where
    G: Generate,
    L: FnMut(&str) -> Result<G, BoxError>,
{
    type Gen = G;

    fn load(&mut self, actor: Actor) -> Result<G, BoxError> {
        let name = self
            .name(actor)
            .ok_or_else(|| format!("the run has no model for {actor:?}"))?
            .to_string();
        (self.loader)(&name)
    }

    fn same_model(&self, a: Actor, b: Actor) -> bool {
        self.name(a).is_some() && self.name(a) == self.name(b)
    }

    fn is_request_error(&self, err: &G::Error) -> bool {
        (self.request_error)(err)
    }

    fn preflight(&self, gen: &G, request: &ChatRequest) -> Result<(), String> {
        (self.preflight)(gen, request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ChatReply;

    struct Named(String);
    impl Generate for Named {
        type Error = std::io::Error;
        fn generate_chat(&mut self, r: &[ChatRequest]) -> Result<Vec<ChatReply>, Self::Error> {
            Err(std::io::Error::other(format!("{} got {}", self.0, r.len())))
        }
    }

    #[test]
    fn loads_by_name_and_shares_equal_names() {
        let mut loaded = Vec::new();
        let mut m = FnModels::new(vec!["a".into(), "b".into()], "a".into(), |name: &str| {
            loaded.push(name.to_string());
            Ok(Named(name.to_string()))
        })
        .with_request_errors(|e| e.kind() == std::io::ErrorKind::InvalidInput);
        assert!(m.same_model(Actor::Candidate(0), Actor::Judge));
        assert!(!m.same_model(Actor::Candidate(1), Actor::Judge));
        assert!(!m.same_model(Actor::Candidate(2), Actor::Candidate(2)));
        assert_eq!(m.load(Actor::Candidate(1)).map(|g| g.0).unwrap(), "b");
        let err = m.load(Actor::Candidate(5)).err().unwrap().to_string();
        assert!(err.contains("no model for Candidate(5)"), "{err}");
        assert!(m.is_request_error(&std::io::Error::from(std::io::ErrorKind::InvalidInput)));
        assert!(!m.is_request_error(&std::io::Error::other("x")));
        drop(m);
        assert_eq!(loaded, ["b"]);
    }
}
