//! `candor bench`: prefill and decode throughput of a model on synthetic prompts, with the
//! definitions of llama.cpp's `llama-batched-bench -npp P -ntg N -npl B` (aggregate tok/s over
//! the batch). Prints one JSON line per batch size, then a human-readable table. The measuring is
//! [`crate::engine::throughput`]'s.

use std::io::Write;

use anyhow::{bail, Context};
use serde_json::json;

use crate::engine::throughput::{self, ThroughputConfig, ThroughputResult};
use crate::engine::SchedulerConfig;
use crate::model::limits;
use crate::model::runner::Model;
use crate::model::transformer::{WeightDType, Work};

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Model: `default`, a GGUF path, or a Hugging Face Hub id (`org/repo[:file.gguf]`, or `org/repo:Q4_K_M` for a quantization).
    #[arg(long, default_value = "default")]
    pub model: String,
    /// Prompt tokens per sequence (llama-batched-bench's `-npp`).
    #[arg(long, default_value_t = 128)]
    pub prompt_tokens: usize,
    /// Tokens decoded per sequence after the prompt (`-ntg`).
    #[arg(long, default_value_t = 64)]
    pub new_tokens: usize,
    /// Sequences prefilled and decoded together (`-npl`); several, comma-separated, are measured
    /// one after another on one load of the model (one JSON line each).
    #[arg(long, default_value = "1", value_delimiter = ',')]
    pub batch_size: Vec<usize>,
    /// Worker threads (default: rayon's choice, one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Weight type: `native` (quantized weights stay quantized) or `f32` (all dequantized).
    #[arg(long, default_value = "native", value_parser = ["native", "f32"])]
    pub dtype: String,
    /// Also measure the machine's limits (read bandwidth over a buffer of this many MiB, all
    /// threads; the integer dot-product peak) and print the fraction reached: decode as the
    /// bytes of weights and KV read per step over the step time against the bandwidth, prefill
    /// as integer multiply-adds per token times tok/s against the peak. `--limits` alone: 1024.
    #[arg(long, value_name = "MIB", num_args = 0..=1, default_missing_value = "1024")]
    pub limits: Option<usize>,
    /// Only measure the limits (`--limits`), no model.
    #[arg(long, requires = "limits")]
    pub limits_only: bool,
    /// Speculative decoding's cost model: also time a verify step of K drafted tokens (K + 1
    /// rows per sequence, every row's logits) against a plain decode step at each batch size,
    /// and print the acceptance rate at which drafting K tokens per step breaks even (drafts
    /// free, as prompt lookup's; with `--draft`, at the draft model's decode step time).
    #[arg(long, value_name = "K")]
    pub verify_tokens: Option<usize>,
    /// A draft model for `--verify-tokens`: its batch-`B` decode step time enters the cost model.
    #[arg(long, value_name = "MODEL", requires = "verify_tokens")]
    pub draft: Option<String>,
    /// Where the model runs: `cpu`, or `cuda` / `cuda:N` (a build with `--features cuda`).
    #[arg(long, value_name = "DEVICE", default_value = "cpu", value_parser = super::run::parse_device)]
    pub device: crate::model::device::DeviceSpec,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    args.device.check_built()?;
    if args.prompt_tokens == 0 || args.batch_size.contains(&0) {
        bail!("--prompt-tokens and --batch-size must be at least 1");
    }
    let mut pool = rayon::ThreadPoolBuilder::new();
    if let Some(n) = args.threads {
        pool = pool.num_threads(n);
    }
    let pool = pool.build().context("starting worker threads")?;
    let threads = pool.current_num_threads();
    let limits = args
        .limits
        .map(|mb| pool.install(|| limits::measure(mb.max(1))));
    if args.limits_only {
        let l = limits.expect("--limits-only requires --limits");
        println!("{}", serde_json::to_string(&l).context("limits as JSON")?);
        return Ok(());
    }
    let files = super::models::resolve(&args.model)?;
    let dtype = match args.dtype.as_str() {
        "f32" => WeightDType::F32,
        _ => WeightDType::Native,
    };
    // Weights only: the prompts are synthetic ids, so random-weight models without a
    // tokenizer can be measured too.
    let model = Model::load_weights(&files, dtype, args.device)
        .with_context(|| format!("loading {}", files.weights.display()))?;
    let draft = match &args.draft {
        Some(d) => {
            let files = super::models::resolve(d)?;
            let m = Model::load_weights(&files, dtype, args.device)
                .with_context(|| format!("loading the draft model {}", files.weights.display()))?;
            Some(m)
        }
        None => None,
    };
    let round = |x: f64| (x * 100.0).round() / 100.0;
    let work = model.transformer().work();
    let mut rows = Vec::with_capacity(args.batch_size.len());
    let mut verify_rows = Vec::new();
    let mut out = std::io::stdout().lock();
    for &batch_size in &args.batch_size {
        let cfg = ThroughputConfig {
            prompt_tokens: args.prompt_tokens,
            new_tokens: args.new_tokens,
            batch_size,
            scheduler: SchedulerConfig {
                batch_size,
                ..SchedulerConfig::default()
            },
        };
        let r = pool
            .install(|| throughput::run(&model, cfg))
            .with_context(|| format!("benchmark at batch size {batch_size}"))?;
        let mut line = json!({
            "model": files.weights.display().to_string(),
            "dtype": args.dtype,
            "device": model.device_name(),
            "threads": threads,
            "prompt_tokens": r.prompt_tokens,
            "new_tokens": r.new_tokens,
            "batch_size": r.batch_size,
            "prefill_s": (r.prefill_s * 1e4).round() / 1e4,
            "prefill_tok_s": round(r.prefill_tok_s),
            "decode_s": (r.decode_s * 1e4).round() / 1e4,
            "decode_tok_s": round(r.decode_tok_s),
            "decode_tok_s_per_seq": round(r.decode_tok_s_per_seq),
            "total_tok_s": round(r.total_tok_s),
            "layer_weight_bytes": work.layer_bytes,
            "output_weight_bytes": work.output_bytes,
            "int_macs_per_token": work.layer_int_macs,
            "kv_bytes_per_position": work.kv_bytes_per_position,
            "decode_bytes_per_step": decode_bytes_per_step(&work, &r),
        });
        if let Some(l) = &limits {
            let decode_gb_s = decode_bytes_per_step(&work, &r) * r.new_tokens as f64
                / r.decode_s.max(1e-12)
                / 1e9;
            let prefill_gmac_s = work.layer_int_macs as f64 * r.prefill_tok_s / 1e9;
            let obj = line.as_object_mut().expect("an object");
            obj.insert("limits".into(), serde_json::to_value(l).context("limits")?);
            obj.insert("decode_read_gb_s".into(), json!(round(decode_gb_s)));
            obj.insert(
                "decode_fraction_of_bandwidth".into(),
                json!((decode_gb_s / l.read_gb_s * 1e3).round() / 1e3),
            );
            obj.insert("prefill_int8_gmac_s".into(), json!(round(prefill_gmac_s)));
            obj.insert(
                "prefill_fraction_of_peak".into(),
                json!((prefill_gmac_s / l.int8_gmac_s * 1e3).round() / 1e3),
            );
        }
        if let Some(k) = args.verify_tokens {
            let cost = pool
                .install(|| throughput::verify_cost(&model, cfg, k + 1))
                .with_context(|| format!("verify cost at batch size {batch_size}"))?;
            let draft_step_s = match &draft {
                Some(d) => {
                    let r = pool
                        .install(|| throughput::run(d, cfg))
                        .with_context(|| format!("draft model at batch size {batch_size}"))?;
                    r.decode_s / r.new_tokens.max(1) as f64
                }
                None => 0.0,
            };
            let even = throughput::break_even_acceptance(&cost, draft_step_s);
            let obj = line.as_object_mut().expect("an object");
            obj.insert(
                "verify".into(),
                json!({
                    "drafted_tokens": k,
                    "decode_step_s": (cost.decode_step_s * 1e6).round() / 1e6,
                    "verify_step_s": (cost.verify_step_s * 1e6).round() / 1e6,
                    "verify_over_decode": (cost.verify_step_s / cost.decode_step_s * 1e3).round() / 1e3,
                    "draft_step_s": (draft_step_s * 1e6).round() / 1e6,
                    "break_even_acceptance": even.map(|a| (a * 1e3).round() / 1e3),
                }),
            );
            verify_rows.push((batch_size, cost, draft_step_s, even));
        }
        // Each line as soon as it is measured, so that a long series shows its progress.
        if !write_quietly(&mut out, &line.to_string())? {
            return Ok(());
        }
        rows.push(r);
    }
    let mut table = String::from(
        "|    PP |     TG |    B |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s | S_TG/seq |\n\
         |-------|--------|------|----------|----------|----------|----------|----------|",
    );
    for r in &rows {
        table.push_str(&format!(
            "\n| {:>5} | {:>6} | {:>4} | {:>8.3} | {:>8.2} | {:>8.3} | {:>8.2} | {:>8.2} |",
            r.prompt_tokens,
            r.new_tokens,
            r.batch_size,
            r.prefill_s,
            r.prefill_tok_s,
            r.decode_s,
            r.decode_tok_s,
            r.decode_tok_s_per_seq
        ));
    }
    if let Some(k) = args.verify_tokens {
        table.push_str(&format!(
            "\n\nverify of {k} drafted tokens ({} rows per sequence) against a decode step:\n\
             |    B | decode ms | verify ms | ratio | draft ms | break-even acceptance |\n\
             |------|-----------|-----------|-------|----------|-----------------------|",
            k + 1
        ));
        for (b, c, d, even) in &verify_rows {
            table.push_str(&format!(
                "\n| {b:>4} | {:>9.3} | {:>9.3} | {:>5.2} | {:>8.3} | {:>21} |",
                c.decode_step_s * 1e3,
                c.verify_step_s * 1e3,
                c.verify_step_s / c.decode_step_s,
                d * 1e3,
                even.map_or("never".to_string(), |a| format!("{a:.3}"))
            ));
        }
    }
    write_quietly(&mut out, &table)?;
    Ok(())
}

/// Writes a line; false when the reader has closed the pipe (scripts read the first JSON line
/// and close it: `| head -1`), which ends the output quietly.
fn write_quietly(out: &mut impl Write, text: &str) -> anyhow::Result<bool> {
    match writeln!(out, "{text}") {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e).context("writing the result"),
        Ok(()) => Ok(true),
    }
}

/// Bytes one decode step reads on average: every matrix once (the output projection too), and
/// each sequence's keys and values at the mean context of the decode steps and its recurrent
/// state.
fn decode_bytes_per_step(work: &Work, r: &ThroughputResult) -> f64 {
    let mean_ctx = r.prompt_tokens as f64 + (r.new_tokens as f64 - 1.0).max(0.0) / 2.0;
    (work.layer_bytes + work.output_bytes) as f64
        + r.batch_size as f64
            * (mean_ctx * work.kv_bytes_per_position as f64 + work.state_bytes_per_sequence as f64)
}
