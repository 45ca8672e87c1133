//! `candor serve`: loads the models and serves them over OpenAI-compatible HTTP endpoints
//! (see [`crate::serve`]) until SIGTERM or Ctrl-C, then drains the requests in flight.

use std::net::SocketAddr;

use anyhow::{bail, Context};

use crate::engine::{Engine, EngineOptions, SchedulerConfig};
use crate::model::transformer::WeightDType;
use crate::serve::{Loader, ServeOptions, Server};

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// A model to serve (repeat for several): `default`, a GGUF path or a Hugging Face Hub id;
    /// `NAME=SPEC` serves it as NAME. Requests name it in `model` (NAME, else SPEC as given).
    #[arg(long = "model", required = true)]
    pub models: Vec<String>,
    /// Address to listen on; only this machine by default.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the address is printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Required as `Authorization: Bearer KEY` on /v1/* (default: $CANDOR_API_KEY if set).
    #[arg(long)]
    pub api_key: Option<String>,
    /// Sequences decoding at once per model (continuous batching).
    #[arg(long, default_value_t = 16)]
    pub batch_size: usize,
    /// Most sequences (choices) per model waiting or decoding; more get 429 with Retry-After.
    #[arg(long, default_value_t = 256)]
    pub queue: usize,
    /// Largest request body in bytes (413 above).
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Weight type: `native` (quantized weights stay quantized) or `f32` (all dequantized).
    #[arg(long, default_value = "native", value_parser = ["native", "f32"])]
    pub dtype: String,
    /// CPU threads for inference (default: every core). Changes speed, never results.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Where the models run: `cpu`, or `cuda` / `cuda:N` (a build with `--features cuda`).
    #[arg(long, value_name = "DEVICE", default_value = "cpu", value_parser = super::run::parse_device)]
    pub device: crate::model::device::DeviceSpec,
    /// On a GPU, the KV pool of each model in MiB (by default one model takes 90% of the memory
    /// left after its weights; several models on one card need this).
    #[arg(long, value_name = "MB")]
    pub gpu_kv_mb: Option<usize>,
    /// Speculative decoding for every served model (`/health` reports its acceptance).
    #[command(flatten)]
    pub draft: super::draft::DraftArgs,
}

/// `NAME=SPEC` or `SPEC`: the served name and the model spec.
fn split_model(arg: &str) -> (String, String) {
    match arg.split_once('=') {
        Some((name, spec)) if !name.is_empty() && !spec.is_empty() => {
            (name.to_string(), spec.to_string())
        }
        _ => (arg.to_string(), arg.to_string()),
    }
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    if args.device != crate::model::device::DeviceSpec::Cpu
        && args.models.len() > 1
        && args.gpu_kv_mb.is_none()
    {
        bail!(
            "{} models on {}: give each a KV pool with --gpu-kv-mb (one model's pool otherwise \
             takes 90% of the card's memory left after its weights)",
            args.models.len(),
            args.device
        );
    }
    args.device.check_built()?;
    if args.batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    if let Some(n) = args.threads {
        if n == 0 {
            bail!("--threads must be at least 1");
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .context("starting worker threads")?;
    }
    let options = EngineOptions {
        dtype: match args.dtype.as_str() {
            "f32" => WeightDType::F32,
            _ => WeightDType::Native,
        },
        device: args.device,
        scheduler: SchedulerConfig {
            batch_size: args.batch_size,
            ..SchedulerConfig::default()
        },
        gpu_kv_bytes: args.gpu_kv_mb.map(|mb| mb << 20),
    };
    let draft = args.draft.spec()?;
    // A draft model is resolved once, here (a Hub id downloads before any model loads).
    let draft_files = match &draft {
        Some(super::draft::DraftSpec::Model(name, _)) => Some(
            super::models::resolve(name)
                .with_context(|| format!("resolving the draft model {name:?}"))?,
        ),
        _ => None,
    };
    let dtype = options.dtype;
    let mut models: Vec<(String, Loader)> = Vec::new();
    for arg in &args.models {
        let (name, spec) = split_model(arg);
        let files = super::models::resolve(&spec).with_context(|| format!("model `{spec}`"))?;
        eprintln!(
            "candor serve: loading `{name}` from {}",
            files.weights.display()
        );
        let draft = draft.clone();
        let draft_files = draft_files.clone();
        models.push((
            name,
            Box::new(move || {
                let mut engine = Engine::from_files(&files, options)?;
                match (&draft, &draft_files) {
                    (Some(d), Some(f)) => engine.set_draft_model(f, dtype, d.config())?,
                    (Some(d), None) => engine.set_lookup_drafts(Some(d.config())),
                    (None, _) => {}
                }
                Ok(engine)
            }),
        ));
    }
    let server = Server::load(
        models,
        ServeOptions {
            api_key: args
                .api_key
                .clone()
                .or_else(|| std::env::var("CANDOR_API_KEY").ok())
                .filter(|k| !k.is_empty()),
            queue: args.queue,
            max_body_bytes: args.max_body_bytes,
        },
    )?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let host: std::net::IpAddr = args
            .host
            .parse()
            .with_context(|| format!("--host `{}` is not an IP address", args.host))?;
        let listener = tokio::net::TcpListener::bind(SocketAddr::new(host, args.port))
            .await
            .with_context(|| format!("binding {}:{}", args.host, args.port))?;
        let addr = listener.local_addr()?;
        // Scripts and tests read this line for the address (with --port 0).
        println!("candor serve: listening on http://{addr}");
        eprintln!(
            "candor serve: models {}; stop with SIGTERM or Ctrl-C (requests in flight finish)",
            server
                .state()
                .models
                .iter()
                .map(|m| m.id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        server.run(listener, shutdown_signal()).await?;
        eprintln!("candor serve: drained and stopped");
        anyhow::Ok(())
    })
}

/// Completes on SIGTERM or Ctrl-C (SIGINT).
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    eprintln!("candor serve: stopping: no new connections; finishing the requests in flight");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names() {
        assert_eq!(split_model("default"), ("default".into(), "default".into()));
        assert_eq!(
            split_model("judge=models/x.gguf"),
            ("judge".into(), "models/x.gguf".into())
        );
    }
}
