//! A published protocol run end to end: the manifest from what the protocol prepared
//! ([`crate::bench::protocol::Prepared`]) and the models' identities, the runner over the
//! plan, the protocol's scoring (with the table of replies that stopped at their length
//! limit, which every protocol reports), and the extra files it renders (FB-Bench's judgements in the
//! authors' format), written atomically beside `results.json`.

use std::path::{Path, PathBuf};

use super::manifest::{DataFile, Environment, Manifest, ModelIdentity, RunIdentity};
use super::model_pool::Models;
use super::progress::Progress;
use super::run::{Run, RunOutcome};
use super::run_dir::write_atomic;
use super::StoreError;
use crate::bench::plan::{Plan, Step, Transcript};
use crate::bench::protocol::{OutputFile, Prepared, Protocol, ProtocolOptions, RunContext};
use crate::bench::table::{length_limit_table, reasoning_table};

/// One protocol run to execute or resume.
pub struct ProtocolRun<'a, Pr: Protocol> {
    pub protocol: &'a Pr,
    pub ctx: &'a RunContext,
    pub options: &'a ProtocolOptions,
    pub prepared: &'a Prepared<Pr::Plan>,
    /// The run directory.
    pub dir: &'a Path,
    /// Every model of the run in its role (`candidate/0`, …, `judge`).
    pub models: Vec<ModelIdentity>,
    pub environment: Environment,
    /// Most requests sent to a model at once.
    pub batch_size: usize,
    /// The share of the items this run takes (`--shard I/N`), recorded in the manifest;
    /// `prepared.items` holds that share only.
    pub shard: Option<super::shard_spec::Shard>,
    /// The chat-template settings per role (thinking, reasoning budget, date).
    pub chat: Option<super::chat_settings::ChatSettings>,
}

/// What a protocol run did.
#[derive(Debug, Clone, PartialEq)]
pub struct ProtocolOutcome {
    pub run: RunOutcome,
    /// The extra files written (absolute path, and what each is).
    pub outputs: Vec<(PathBuf, String)>,
}

impl<Pr: Protocol> ProtocolRun<'_, Pr> {
    /// The manifest this run writes (or compares on resume).
    pub fn manifest(&self) -> Result<Manifest, StoreError> {
        let p = self.prepared;
        let data_files = p
            .data_files
            .iter()
            .map(|f| DataFile::from_path(f))
            .collect::<Result<Vec<_>, _>>()?;
        let identity = RunIdentity {
            candor_version: env!("CARGO_PKG_VERSION").to_string(),
            protocol: self.protocol.name().to_string(),
            settings: p.settings.clone(),
            seed: self.ctx.seed,
            models: self.models.clone(),
            data_files,
            prompt_templates: p.prompt_templates.clone(),
            decoding: p.decoding.clone(),
            items: Default::default(),
            shard: self.shard.clone(),
            chat: self.chat.clone(),
        };
        Ok(Manifest::new(identity, self.environment.clone()))
    }

    /// Runs (or resumes) to the end, then writes the protocol's extra files.
    pub fn execute<M: Models>(
        self,
        models: &mut M,
        progress: &mut dyn Progress,
    ) -> Result<ProtocolOutcome, StoreError> {
        let manifest = self.manifest()?;
        let mut outputs: Vec<OutputFile> = Vec::new();
        let plan = Planned {
            protocol: self.protocol,
            prepared: self.prepared,
        };
        let run = Run {
            dir: self.dir,
            manifest,
            plan: &plan,
            items: &self.prepared.items,
            batch_size: self.batch_size,
        };
        let outcome = run.execute(models, progress, |runs| {
            let scored = self
                .protocol
                .score(self.ctx, self.options, self.prepared, runs);
            outputs = scored.outputs;
            let mut results = scored.results;
            // Every protocol reports the replies that stopped at their length limit, per step
            // kind.
            results
                .tables
                .push(length_limit_table(runs.iter().map(|(_, t)| *t)));
            // Thinking models: reasoning length per step kind and the replies cut inside it.
            results
                .tables
                .extend(reasoning_table(runs.iter().map(|(_, t)| *t)));
            results
        })?;
        let mut written = Vec::new();
        for file in outputs {
            let path = self.dir.join(&file.path);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| StoreError::io(parent, e))?;
            }
            write_atomic(&path, &file.bytes)?;
            written.push((path, file.note));
        }
        Ok(ProtocolOutcome {
            run: outcome,
            outputs: written,
        })
    }
}

/// A protocol's plan with the protocol's step counts ([`Protocol::planned_steps`]).
struct Planned<'a, Pr: Protocol> {
    protocol: &'a Pr,
    prepared: &'a Prepared<Pr::Plan>,
}

impl<Pr: Protocol> Plan for Planned<'_, Pr> {
    type Item = <Pr::Plan as Plan>::Item;

    fn item_id(&self, item: &Self::Item) -> String {
        self.prepared.plan.item_id(item)
    }

    fn next_steps(&self, item: &Self::Item, done: &Transcript) -> Vec<Step> {
        self.prepared.plan.next_steps(item, done)
    }

    fn planned_steps(&self, item: &Self::Item) -> Option<usize> {
        self.protocol
            .planned_steps(self.prepared, item)
            .or_else(|| self.prepared.plan.planned_steps(item))
    }
}
