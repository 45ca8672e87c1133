//! The authors' public data: where it lives, and fetching it at pinned commits into a cache.
//!
//! Every file a protocol reads is listed in [`FILES`] with its size and sha256 (computed from
//! the authors' files) and, where the authors publish it as a file, the repository, commit and
//! path it comes from. `candor data fetch` and the first `candor run` of a protocol download
//! the missing files into the cache ([`cache_root`]: `$CANDOR_HOME/data`, else the platform
//! cache folder), from raw GitHub URLs at the pinned commits, or from `$CANDOR_MIRROR/<file>`
//! when a mirror is set (a mirror is a copy of the data folder served over HTTP; files the
//! authors do not publish as single files come only from a mirror or a local copy).
//!
//! A download goes to `<file>.part`, resumes with an HTTP `Range` request when a `.part` is
//! there, never takes more bytes than the table says, and is renamed into place only after its
//! sha256 matches: a mismatch deletes the `.part` and is refused, so a partial or altered
//! download is never read. With `$CANDOR_OFFLINE=1` (or `HF_HUB_OFFLINE=1`) nothing touches the
//! network; a missing file is then an error naming it. `--data` / `$CANDOR_DATA` name a local
//! copy, which is used as it is. ReaLMistake's archive is stored as the authors encrypted it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

/// Names the cache's parent folder (`$CANDOR_HOME/data`).
pub const HOME_ENV: &str = "CANDOR_HOME";
/// Replaces the download base URL: files are fetched from `$CANDOR_MIRROR/<file>`.
pub const MIRROR_ENV: &str = "CANDOR_MIRROR";
/// Set to `1` (or `true`/`yes`/`on`), the network is never used.
pub const OFFLINE_ENV: &str = "CANDOR_OFFLINE";
/// Honoured like [`OFFLINE_ENV`], for machines already set up for Hugging Face offline use.
pub const HF_OFFLINE_ENV: &str = "HF_HUB_OFFLINE";
/// Where files with a pinned upstream come from without a mirror.
pub const GITHUB_RAW: &str = "https://raw.githubusercontent.com";

/// The protocols whose data can be fetched (folder names under the data root).
pub const PROTOCOLS: &[&str] = &["fbbench", "refutebench", "realmistake", "fennec"];

/// Errors of the data store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("unknown protocol `{0}` (known: fbbench, refutebench, realmistake, fennec)")]
    UnknownProtocol(String),
    #[error("{rel}: not in the cache and offline mode is on (${OFFLINE_ENV}); fetch it with `candor data fetch` on a connected machine, or point --data / $CANDOR_DATA at a local copy")]
    Offline { rel: String },
    #[error("{rel}: the authors do not publish this file on its own; set ${MIRROR_ENV} to a mirror of the data folder, or point --data / $CANDOR_DATA at a local copy")]
    NoSource { rel: String },
    #[error("{url}: {msg}")]
    Http { url: String, msg: String },
    #[error("{url}: sha256 {found}, expected {expected}; the download was deleted")]
    Sha256 {
        url: String,
        found: String,
        expected: String,
    },
    #[error(
        "{url}: the server sent more than the {expected} bytes of {rel}; the download was deleted"
    )]
    TooLong {
        url: String,
        rel: String,
        expected: u64,
    },
    #[error("{}: the {protocol} data folder was not found (set --data or $CANDOR_DATA, or unset them to fetch into the cache)", path.display())]
    Missing { path: PathBuf, protocol: String },
}

type Result<T, E = DataError> = std::result::Result<T, E>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DataError + '_ {
    move |source| DataError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Where a file is published: `https://raw.githubusercontent.com/<repo>/<commit>/<path>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Upstream {
    pub repo: &'static str,
    pub commit: &'static str,
    pub path: &'static str,
}

/// One file of the data folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataFile {
    /// Path under the data root, `/`-separated; the first component is the protocol.
    pub rel: &'static str,
    pub size: u64,
    pub sha256: &'static str,
    pub upstream: Option<Upstream>,
}

impl DataFile {
    pub fn protocol(&self) -> &'static str {
        self.rel.split('/').next().unwrap_or("")
    }
}

/// Every file of the authors' data, as in `../shared/data` (see its README for the sources and
/// licences); sizes and sha256 computed from those files.
#[rustfmt::skip]
pub const FILES: &[DataFile] = &[
    DataFile { rel: "fbbench/tables/v1_overall_score.csv", size: 1192, sha256: "5a961003c88e8b4d786ac9371dfc5aea21fe0a4c131f1830f874b459704ca0ef", upstream: None },
    DataFile { rel: "fbbench/tables/v1_per_error_score.csv", size: 594, sha256: "50ce467bb9b65d8c845c8ffc92789ffc360e496283c8cfc75f9f8f2373f51c69", upstream: None },
    DataFile { rel: "fbbench/tables/v1_per_feedback_score_antisyco.csv", size: 502, sha256: "3569746dbd4ee78f96d41b86a0ed30e16cd59be97307d5e3496adefb42814819", upstream: None },
    DataFile { rel: "fbbench/tables/v1_per_feedback_score_correct.csv", size: 712, sha256: "141ff0e6d3a91c2c6d80a388f7d585baf8ce9fa06be09cdfa1b2563a8ee1c57a", upstream: None },
    DataFile { rel: "fbbench/tables/v1_per_task_score.csv", size: 896, sha256: "97a046ad2efbea2b9b86797021d6ddaa095241e5ddd499772549e28b147eb70b", upstream: None },
    DataFile { rel: "fbbench/tables/v3_overall_score.csv", size: 735, sha256: "737173c7ae150cdc389726f308229859e1c6d262fcd3bd14ff04c240cf2679ad", upstream: None },
    DataFile { rel: "fbbench/tables/v3_per_error_score.csv", size: 3309, sha256: "c97740a210906e1c395067836d4c4b5e126a433598e1686deac84cd17d57c9b7", upstream: None },
    DataFile { rel: "fbbench/tables/v3_per_feedback_score_antisyco.csv", size: 2672, sha256: "47e8afb76e1ad921bbe53f7bc8e8ed87696cbce86e8584551c1f314d5f0fe485", upstream: None },
    DataFile { rel: "fbbench/tables/v3_per_feedback_score_correct.csv", size: 3948, sha256: "0bc4a29f9f433c5db23fa728b3d45110aa9240dc9da7979fc3f1f0f539da01b8", upstream: None },
    DataFile { rel: "fbbench/tables/v3_per_task_score.csv", size: 5222, sha256: "136479ec38c3d6790030ed09c075fd94902d4d3bd6541687156c14fb377c36d1", upstream: None },
    DataFile { rel: "fbbench/v1/answers/Meta-Llama-3.1-8B-Instruct.jsonl", size: 4057540, sha256: "6ed7b5cafd94a5bdd7c0aff0235bb03a8aa75a6542e5d87b09a4234839c75b10", upstream: Some(Upstream { repo: "PKU-Baichuan-MLSystemLab/FB-Bench", commit: "1ecdbfd", path: "data/feedback-benchmark/model_answer/Meta-Llama-3.1-8B-Instruct.jsonl" }) },
    DataFile { rel: "fbbench/v1/answers/Mistral-7B-Instruct-v0.3.jsonl", size: 3562348, sha256: "951835031eeca6ed75678bd263c8238def6bf0bcd5de2d3a761c31b974dcd1d0", upstream: Some(Upstream { repo: "PKU-Baichuan-MLSystemLab/FB-Bench", commit: "1ecdbfd", path: "data/feedback-benchmark/model_answer/Mistral-7B-Instruct-v0.3.jsonl" }) },
    DataFile { rel: "fbbench/v1/answers/Qwen2.5-7B-Instruct.jsonl", size: 3982290, sha256: "6dbb0432615dd9bafb567ab439901dbe84a2b298eed1a18a3832388b4a195455", upstream: Some(Upstream { repo: "PKU-Baichuan-MLSystemLab/FB-Bench", commit: "1ecdbfd", path: "data/feedback-benchmark/model_answer/Qwen2.5-7B-Instruct.jsonl" }) },
    DataFile { rel: "fbbench/v1/fb_bench_dataset.json", size: 2782682, sha256: "6ff5382d6490bb7a502824ba57f2058aedf09680a8d2532e6f6ca4cdcfa2cfe5", upstream: Some(Upstream { repo: "PKU-Baichuan-MLSystemLab/FB-Bench", commit: "1ecdbfd", path: "data/feedback-benchmark/fb_bench_dataset.json" }) },
    DataFile { rel: "fbbench/v1/judgments/Phi-3-medium-4k-instruct.jsonl", size: 4098674, sha256: "53a7efe99ea3a28a0a2a784f49146877e11bfb8eb711bc7c7c10f852c41ea38b", upstream: Some(Upstream { repo: "PKU-Baichuan-MLSystemLab/FB-Bench", commit: "1ecdbfd", path: "data/feedback-benchmark/model_judgment/gpt-4o-2024-08-06/Phi-3-medium-4k-instruct.jsonl" }) },
    DataFile { rel: "fbbench/v1/judgments/gemma-2-9b-it.jsonl", size: 4014050, sha256: "a35603cb088ccc526355a4c4382993b42808e9d86265fc6f529f337a1d4dd19f", upstream: Some(Upstream { repo: "PKU-Baichuan-MLSystemLab/FB-Bench", commit: "1ecdbfd", path: "data/feedback-benchmark/model_judgment/gpt-4o-2024-08-06/gemma-2-9b-it.jsonl" }) },
    DataFile { rel: "fbbench/v3/fb_bench_dataset_v3.json", size: 1803247, sha256: "38c1a33a8dae1271f598bb05fd3f49e544eb42c8662af0c9a7daad844d9a9047", upstream: Some(Upstream { repo: "PKU-Baichuan-MLSystemLab/FB-Bench", commit: "dacc09b", path: "data/feedback-benchmark/fb_bench_dataset_v3.json" }) },
    DataFile { rel: "fbbench/v3/judgments/DeepSeek-V3.jsonl", size: 3324253, sha256: "d768c597778454b00d4f8a1fe1ec6c8a0e4ee977057e0ade3963d9ecae55bad1", upstream: Some(Upstream { repo: "PKU-Baichuan-MLSystemLab/FB-Bench", commit: "dacc09b", path: "data/feedback-benchmark/model_judgment/gpt-4o-2024-08-06/DeepSeek-V3.jsonl" }) },
    DataFile { rel: "fbbench/v3/judgments/Phi-3-medium-4k-instruct.jsonl", size: 2730954, sha256: "eb343282260ceb6052d2622c789a3c5f4a6ff627320437f299c08bbb920b1e73", upstream: Some(Upstream { repo: "PKU-Baichuan-MLSystemLab/FB-Bench", commit: "dacc09b", path: "data/feedback-benchmark/model_judgment/gpt-4o-2024-08-06/Phi-3-medium-4k-instruct.jsonl" }) },
    DataFile { rel: "fbbench/v3/judgments/Qwen2.5-72B-Instruct.jsonl", size: 3132000, sha256: "e6216e27be2273b5656f051d342dd5bc843413001255bc6270b70c2b43dd4bb0", upstream: Some(Upstream { repo: "PKU-Baichuan-MLSystemLab/FB-Bench", commit: "dacc09b", path: "data/feedback-benchmark/model_judgment/gpt-4o-2024-08-06/Qwen2.5-72B-Instruct.jsonl" }) },
    DataFile { rel: "fbbench/v3/judgments/Yi-1.5-34B-Chat.jsonl", size: 2874691, sha256: "91bd32f096fbfee1eec24478bce3a2670eda5bd1f568ceb9865f5417e2fed251", upstream: Some(Upstream { repo: "PKU-Baichuan-MLSystemLab/FB-Bench", commit: "dacc09b", path: "data/feedback-benchmark/model_judgment/gpt-4o-2024-08-06/Yi-1.5-34B-Chat.jsonl" }) },
    DataFile { rel: "fbbench/v3/judgments/claude-3-5-sonnet-20241022.jsonl", size: 2952672, sha256: "e3715a72f0a3c866da7cdfca566beb194617180636b1b64f66a32162042d4a22", upstream: Some(Upstream { repo: "PKU-Baichuan-MLSystemLab/FB-Bench", commit: "dacc09b", path: "data/feedback-benchmark/model_judgment/gpt-4o-2024-08-06/claude-3-5-sonnet-20241022.jsonl" }) },
    DataFile { rel: "fbbench/v3/judgments/gemma-2-9b-it.jsonl", size: 2663491, sha256: "6293a4064e61cefca68f4debedc8bb443f20a9283cb2d7faaa1dec9cbfc28676", upstream: Some(Upstream { repo: "PKU-Baichuan-MLSystemLab/FB-Bench", commit: "dacc09b", path: "data/feedback-benchmark/model_judgment/gpt-4o-2024-08-06/gemma-2-9b-it.jsonl" }) },
    DataFile { rel: "fbbench/v3/judgments/gpt-4o-2024-05-13.jsonl", size: 3143394, sha256: "e760fd919b721d605f7b42bbfb4231c4a618393d9a33917658705dcc029bf065", upstream: Some(Upstream { repo: "PKU-Baichuan-MLSystemLab/FB-Bench", commit: "dacc09b", path: "data/feedback-benchmark/model_judgment/gpt-4o-2024-08-06/gpt-4o-2024-05-13.jsonl" }) },
    DataFile { rel: "fbbench/v3/judgments/internlm2_5-20b-chat.jsonl", size: 3038327, sha256: "8322f4a749644737a5fc4b237d6744520fa3d3bd20b9ccc946fdc9900696034d", upstream: Some(Upstream { repo: "PKU-Baichuan-MLSystemLab/FB-Bench", commit: "dacc09b", path: "data/feedback-benchmark/model_judgment/gpt-4o-2024-08-06/internlm2_5-20b-chat.jsonl" }) },
    DataFile { rel: "fbbench/v3/judgments/internlm2_5-7b-chat.jsonl", size: 3148219, sha256: "36b8fb65dbcc4b0c244f18023ed9c126450b2051afc761c8c689c26e0caf801a", upstream: Some(Upstream { repo: "PKU-Baichuan-MLSystemLab/FB-Bench", commit: "dacc09b", path: "data/feedback-benchmark/model_judgment/gpt-4o-2024-08-06/internlm2_5-7b-chat.jsonl" }) },
    DataFile { rel: "fbbench/v3/judgments/moonshot-v1-32k.jsonl", size: 3089796, sha256: "139618a69e864cc2d4c0612f3e2231d35565e617eb99cb982c4b78b60108c56e", upstream: Some(Upstream { repo: "PKU-Baichuan-MLSystemLab/FB-Bench", commit: "dacc09b", path: "data/feedback-benchmark/model_judgment/gpt-4o-2024-08-06/moonshot-v1-32k.jsonl" }) },
    DataFile { rel: "fbbench/v3/judgments/phi-4.jsonl", size: 3005644, sha256: "4bb13ff3b00d93c2ee53d2c7702532fd2516d6e59128973361baead292c3f162", upstream: Some(Upstream { repo: "PKU-Baichuan-MLSystemLab/FB-Bench", commit: "dacc09b", path: "data/feedback-benchmark/model_judgment/gpt-4o-2024-08-06/phi-4.jsonl" }) },
    DataFile { rel: "fbbench/v3/judgments/qwen-max-0919.jsonl", size: 3187232, sha256: "a5266fc368671d21ce8a54b257222a2c06e4524448706dbe608b6ec0d1f45110", upstream: Some(Upstream { repo: "PKU-Baichuan-MLSystemLab/FB-Bench", commit: "dacc09b", path: "data/feedback-benchmark/model_judgment/gpt-4o-2024-08-06/qwen-max-0919.jsonl" }) },
    DataFile { rel: "fbbench/v3/judgments/yi-lightning.jsonl", size: 3361968, sha256: "43bf6276646f52de1e0f6e3589d4ec52b8340ba8e6072f909a68880012e89bca", upstream: Some(Upstream { repo: "PKU-Baichuan-MLSystemLab/FB-Bench", commit: "dacc09b", path: "data/feedback-benchmark/model_judgment/gpt-4o-2024-08-06/yi-lightning.jsonl" }) },
    DataFile { rel: "fennec/auto-j/pairwise_example_output.jsonl", size: 19488, sha256: "bbf9a67b39cef50d15dccbcfc5816dc83241b80493064e615695ce002c0bcb61", upstream: Some(Upstream { repo: "GAIR-NLP/auto-j", commit: "2ae17a3", path: "data/outputs/pairwise_example_output.jsonl" }) },
    DataFile { rel: "fennec/auto-j/pairwise_exchange_example_output.jsonl", size: 19488, sha256: "0b3a4ef917edc1df0b8f48ef376f8065651d9bcb2375eddd0e844a7c992daaad", upstream: Some(Upstream { repo: "GAIR-NLP/auto-j", commit: "2ae17a3", path: "data/outputs/pairwise_exchange_example_output.jsonl" }) },
    DataFile { rel: "fennec/auto-j/testdata_pairwise.jsonl", size: 4066039, sha256: "56f32fad71d9b6b33bc4d51794c324981e26355bcbf3ce4908d7f8ddcc61f80e", upstream: Some(Upstream { repo: "GAIR-NLP/auto-j", commit: "2ae17a3", path: "data/test/testdata_pairwise.jsonl" }) },
    DataFile { rel: "fennec/mt_bench/question.jsonl", size: 48929, sha256: "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7", upstream: Some(Upstream { repo: "lm-sys/FastChat", commit: "0e6d3e4", path: "fastchat/llm_judge/data/mt_bench/question.jsonl" }) },
    DataFile { rel: "fennec/pandalm/testset-v1.json", size: 937899, sha256: "cc154f9067c7382d7ea86f8f246511a5e1ac87e1fddd845c5938d789505b07a4", upstream: Some(Upstream { repo: "WeOpenML/PandaLM", commit: "3871806", path: "data/testset-v1.json" }) },
    DataFile { rel: "realmistake/data.zip", size: 491156, sha256: "84621a2898fe3ff9ad4162a00e44a19d586ff5ad39ff4a785c79b28d06d9159a", upstream: Some(Upstream { repo: "psunlpgroup/ReaLMistake", commit: "f94a8b978926414deb1dcf6b50076fd06c892192", path: "data.zip" }) },
    DataFile { rel: "realmistake/detector_outputs_open.zip", size: 4041205, sha256: "6224dcb38d7de6830c81cfa9d66acbe2df194a0f00aaffe744ba26fa6eebdff9", upstream: None },
    DataFile { rel: "realmistake/published_performance.json", size: 368332, sha256: "9c6139b929c471713b60c51528efd85caaedf3aec7fbf2d4ec36de2bc2a3d39d", upstream: None },
    DataFile { rel: "refutebench/email/multi/email.jsonl", size: 305739, sha256: "1a4496b5c4204a6037505579c834ea256f6e369ae77e6dfa1b8eec7056aea99d", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/email/multi/email.jsonl" }) },
    DataFile { rel: "refutebench/email/single/email.generalization.NC-0.jsonl", size: 114578, sha256: "00268991b54d615e9db89865ac06ae0362c978f786256a18082c44f9fd98d30f", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/email/single/email.generalization.NC-0.jsonl" }) },
    DataFile { rel: "refutebench/email/single/email.generalization.NC-1.jsonl", size: 132547, sha256: "3fbc9fb2d23588ea7e71954570e1391c0b6fd70244477f40fe4f7d9a270b9258", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/email/single/email.generalization.NC-1.jsonl" }) },
    DataFile { rel: "refutebench/email/single/email.generalization.NC-2.jsonl", size: 139669, sha256: "95510ec8525d523752559c58dca347a40b4cf191869260be498f04e3a51cc0c0", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/email/single/email.generalization.NC-2.jsonl" }) },
    DataFile { rel: "refutebench/email/single/email.generalization.NC-3.jsonl", size: 160356, sha256: "bb6aadf13510cfce1b26cd8cf5e7871209a2858aa8b7119687d64bdf1aa7ec57", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/email/single/email.generalization.NC-3.jsonl" }) },
    DataFile { rel: "refutebench/email/single/email.memory.NC-0.jsonl", size: 114894, sha256: "c86c656cf253e06fa87f3a1ed7fe48167bd20979426e7af9f1dc07da92a85ea0", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/email/single/email.memory.NC-0.jsonl" }) },
    DataFile { rel: "refutebench/email/single/email.memory.NC-1.jsonl", size: 130200, sha256: "c0b6e7d62763c5c27ff71964b53078a712210165b5a06582dd3c2be226f24fb3", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/email/single/email.memory.NC-1.jsonl" }) },
    DataFile { rel: "refutebench/email/single/email.memory.NC-2.jsonl", size: 145544, sha256: "5fee09ca7cbc29f172a524611daa5be4186a3e0d09573a603ab805691cb09cfb", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/email/single/email.memory.NC-2.jsonl" }) },
    DataFile { rel: "refutebench/email/single/email.memory.NC-3.jsonl", size: 162850, sha256: "b37424f0b0338ce1c0ccfb26785a4ab1867878fc7ee650629d5aef9cd648473f", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/email/single/email.memory.NC-3.jsonl" }) },
    DataFile { rel: "refutebench/mt/multi/en-he.jsonl", size: 424187, sha256: "40275ecf8406fc293ec000c1b64db8be787928f9e89f3c0d5ecb38aaa52af575", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/mt/multi/en-he.jsonl" }) },
    DataFile { rel: "refutebench/mt/multi/en-zh.jsonl", size: 671680, sha256: "50ba605a41338ff6ad14581f05345fcb37c5bdf5f43e6659c35e75cb1f47410d", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/mt/multi/en-zh.jsonl" }) },
    DataFile { rel: "refutebench/mt/single/en-he.generalization.NC-0.jsonl", size: 202021, sha256: "1da44f4dce956ea2cd8ac1d3dbeceadbf86432ddd925764f4ca064b002f59b33", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/mt/single/en-he.generalization.NC-0.jsonl" }) },
    DataFile { rel: "refutebench/mt/single/en-he.generalization.NC-1.jsonl", size: 246876, sha256: "e746a85abdda57b2eee95be169791dcbf83dff6ba1d41f892fd0db7880e5f698", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/mt/single/en-he.generalization.NC-1.jsonl" }) },
    DataFile { rel: "refutebench/mt/single/en-he.generalization.NC-2.jsonl", size: 287180, sha256: "8ac48869844627a00787679cd1bb3f0fd83cbf9aba95450c9a3b6e363e96c338", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/mt/single/en-he.generalization.NC-2.jsonl" }) },
    DataFile { rel: "refutebench/mt/single/en-he.generalization.NC-3.jsonl", size: 328061, sha256: "a12d4ceb65f48555fd70bda786e1c7e4b00fedc01b16f6e0f3a9d228e88b9e47", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/mt/single/en-he.generalization.NC-3.jsonl" }) },
    DataFile { rel: "refutebench/mt/single/en-he.memory.NC-0.jsonl", size: 200783, sha256: "63c5cbc5d41caa15bb4714daeb9f178e1356cfae8aa74b87ed5ddd60bc2d5f8b", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/mt/single/en-he.memory.NC-0.jsonl" }) },
    DataFile { rel: "refutebench/mt/single/en-he.memory.NC-1.jsonl", size: 242687, sha256: "93f6cf7c1779685a3a4687d609d0160465f08c13f9fb215b9e7fdccd48e3a73c", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/mt/single/en-he.memory.NC-1.jsonl" }) },
    DataFile { rel: "refutebench/mt/single/en-he.memory.NC-2.jsonl", size: 286199, sha256: "a096cdc4bc8a5a2a149ad925f0e930ad9e9f7e89057146bb3ed72b9f7edf59fd", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/mt/single/en-he.memory.NC-2.jsonl" }) },
    DataFile { rel: "refutebench/mt/single/en-he.memory.NC-3.jsonl", size: 326604, sha256: "bb7fc25af857a666e4a61cf61db914bf1bf6601817da2d5087b62353e32ec282", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/mt/single/en-he.memory.NC-3.jsonl" }) },
    DataFile { rel: "refutebench/mt/single/en-zh.generalization.NC-0.jsonl", size: 203729, sha256: "59e0cc08361e550418fe9360016d3a4ce2f75cfab01cf21512153b48eb0f530c", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/mt/single/en-zh.generalization.NC-0.jsonl" }) },
    DataFile { rel: "refutebench/mt/single/en-zh.generalization.NC-1.jsonl", size: 245529, sha256: "d68694add087befcb63b0275b99e85aa59db52bd28535dabbba53e905756422f", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/mt/single/en-zh.generalization.NC-1.jsonl" }) },
    DataFile { rel: "refutebench/mt/single/en-zh.generalization.NC-2.jsonl", size: 288187, sha256: "39d059f406882983e7fbee73d86a9b9ea1c261f0ba98e0158cc55f71916af686", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/mt/single/en-zh.generalization.NC-2.jsonl" }) },
    DataFile { rel: "refutebench/mt/single/en-zh.generalization.NC-3.jsonl", size: 337372, sha256: "4247b660ec47c32298820491bb92c660f321ad8ed750d7f5d614a90341caaa0d", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/mt/single/en-zh.generalization.NC-3.jsonl" }) },
    DataFile { rel: "refutebench/mt/single/en-zh.memory.NC-0.jsonl", size: 202969, sha256: "5dcb89c0f1d72d06926d461977f78b23f5c9e73fbdd60f769f533d371d46d163", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/mt/single/en-zh.memory.NC-0.jsonl" }) },
    DataFile { rel: "refutebench/mt/single/en-zh.memory.NC-1.jsonl", size: 249305, sha256: "26d02744d948ed76d6683a4f62fba95b3acbea37ae6c87e7fc47731cd164c29d", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/mt/single/en-zh.memory.NC-1.jsonl" }) },
    DataFile { rel: "refutebench/mt/single/en-zh.memory.NC-2.jsonl", size: 283504, sha256: "9d38d4237b85a7847239d6307aaeff36a34490173571b5fc26994676e384cced", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/mt/single/en-zh.memory.NC-2.jsonl" }) },
    DataFile { rel: "refutebench/mt/single/en-zh.memory.NC-3.jsonl", size: 325353, sha256: "5cb870a23221b5f4aca4bed4e40037c794e526184f45aa15f99c0cbe6b184fdd", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/mt/single/en-zh.memory.NC-3.jsonl" }) },
    DataFile { rel: "refutebench/qa/multi/qa.jsonl", size: 526329, sha256: "d61cf84611484cee67165c81473d48cec06ce518d12467187db9bd493bf6967a", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/qa/multi/qa.jsonl" }) },
    DataFile { rel: "refutebench/qa/single/qa.generalization.NC-0.jsonl", size: 738335, sha256: "f7f1575eb0d39c27696d3db9ab31b1f89ed90a66e7af97ccabf20053c9fe5c12", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/qa/single/qa.generalization.NC-0.jsonl" }) },
    DataFile { rel: "refutebench/qa/single/qa.generalization.NC-1.jsonl", size: 952902, sha256: "1e8417ed20bba47cf67b3870d69956fed141df3e2e15680d6361d8a796c80601", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/qa/single/qa.generalization.NC-1.jsonl" }) },
    DataFile { rel: "refutebench/qa/single/qa.generalization.NC-2.jsonl", size: 1151819, sha256: "f69c65d9dbfdb2a28cd1fde63b4022e181e668381c635eedef81d3756668cf81", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/qa/single/qa.generalization.NC-2.jsonl" }) },
    DataFile { rel: "refutebench/qa/single/qa.generalization.NC-3.jsonl", size: 1372874, sha256: "c2432fd0fb519a612611c03d25ad691150996f4a15f7c23ee9361f7177d81b62", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/qa/single/qa.generalization.NC-3.jsonl" }) },
    DataFile { rel: "refutebench/qa/single/qa.memory.NC-0.jsonl", size: 106062, sha256: "2c61d903a475fc25e3f17bfc4fbffb116ec79c530f79d3d0f3ad4de9dba74936", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/qa/single/qa.memory.NC-0.jsonl" }) },
    DataFile { rel: "refutebench/qa/single/qa.memory.NC-1.jsonl", size: 141861, sha256: "9e39ed729ff1e1e615499d034fd22999914977129fd206392ca552e2ef5ff062", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/qa/single/qa.memory.NC-1.jsonl" }) },
    DataFile { rel: "refutebench/qa/single/qa.memory.NC-2.jsonl", size: 177538, sha256: "7de3d6b8b3b34074603f043f26a460ed0032629a943a6313a32aa21cd5cd0f7b", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/qa/single/qa.memory.NC-2.jsonl" }) },
    DataFile { rel: "refutebench/qa/single/qa.memory.NC-3.jsonl", size: 200960, sha256: "94f3287d2ad99d69f16b9c5d63d5d3dbeaf5a232bf3f9f2dfbc512172c787428", upstream: Some(Upstream { repo: "ElliottYan/RefuteBench", commit: "24c2135b00054fc8a56ed85e93acb59fdafa8852", path: "data/qa/single/qa.memory.NC-3.jsonl" }) },
];

/// The files of one protocol.
pub fn files_for(protocol: &str) -> Result<Vec<&'static DataFile>> {
    if !PROTOCOLS.contains(&protocol) {
        return Err(DataError::UnknownProtocol(protocol.to_string()));
    }
    Ok(FILES.iter().filter(|f| f.protocol() == protocol).collect())
}

/// The cache: `$CANDOR_HOME/data`, else `<platform cache dir>/candor/data`, else
/// `.candor/data`.
pub fn cache_root() -> PathBuf {
    match std::env::var_os(HOME_ENV) {
        Some(home) if !home.is_empty() => PathBuf::from(home).join("data"),
        _ => dirs::cache_dir()
            .map(|d| d.join("candor"))
            .unwrap_or_else(|| PathBuf::from(".candor"))
            .join("data"),
    }
}

/// The data root a run uses when `--data` is not given: `$CANDOR_DATA`, else `../shared/data`
/// when that folder exists (a checkout beside the shared data), else the cache.
pub fn default_root() -> PathBuf {
    if let Some(d) = std::env::var_os(crate::bench::DATA_ENV) {
        return PathBuf::from(d);
    }
    let beside = PathBuf::from("../shared/data");
    if beside.is_dir() {
        return beside;
    }
    cache_root()
}

/// Whether offline mode is on.
pub fn offline() -> bool {
    [OFFLINE_ENV, HF_OFFLINE_ENV].iter().any(|k| {
        std::env::var(k).is_ok_and(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "true" | "yes" | "on"
            )
        })
    })
}

/// Where downloads come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// `$CANDOR_MIRROR`, without a trailing `/`.
    pub mirror: Option<String>,
    pub offline: bool,
}

impl Source {
    /// From the environment.
    pub fn from_env() -> Source {
        Source {
            mirror: std::env::var(MIRROR_ENV)
                .ok()
                .filter(|m| !m.trim().is_empty())
                .map(|m| m.trim().trim_end_matches('/').to_string()),
            offline: offline(),
        }
    }

    /// The URL a file is fetched from.
    pub fn url(&self, file: &DataFile) -> Result<String> {
        match (&self.mirror, file.upstream) {
            (Some(m), _) => Ok(format!("{m}/{}", file.rel)),
            (None, Some(u)) => Ok(format!("{GITHUB_RAW}/{}/{}/{}", u.repo, u.commit, u.path)),
            (None, None) => Err(DataError::NoSource {
                rel: file.rel.to_string(),
            }),
        }
    }
}

/// What [`fetch_file`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fetched {
    /// The file was already in place (right size).
    Present,
    /// Downloaded; `resumed_from` bytes came from an earlier `.part`.
    Downloaded { bytes: u64, resumed_from: u64 },
}

/// State of one file in a data root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Present,
    /// A `.part` of this many bytes waits to be resumed.
    Partial(u64),
    /// A file is there with another size than the table's.
    WrongSize(u64),
    Missing,
}

/// The state of a file under `root` (sizes only; hashes are checked when fetching).
pub fn status(root: &Path, file: &DataFile) -> Status {
    let dest = root.join(file.rel);
    match std::fs::metadata(&dest) {
        Ok(m) if m.len() == file.size => Status::Present,
        Ok(m) => Status::WrongSize(m.len()),
        Err(_) => match std::fs::metadata(part_path(&dest)) {
            Ok(m) => Status::Partial(m.len()),
            Err(_) => Status::Missing,
        },
    }
}

fn part_path(dest: &Path) -> PathBuf {
    let mut name = dest.file_name().unwrap_or_default().to_os_string();
    name.push(".part");
    dest.with_file_name(name)
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(30))
        .timeout_read(Duration::from_secs(60))
        .build()
}

fn sha256_of(path: &Path) -> Result<String> {
    let mut f = File::open(path).map_err(io(path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

/// Makes `root/<file>` present: nothing to do when it is there with the right size; else
/// downloads it (resuming a `.part`), checks its sha256 and renames it into place.
pub fn fetch_file(root: &Path, file: &DataFile, source: &Source) -> Result<Fetched> {
    let dest = root.join(file.rel);
    if std::fs::metadata(&dest).is_ok_and(|m| m.len() == file.size) {
        return Ok(Fetched::Present);
    }
    if source.offline {
        return Err(DataError::Offline {
            rel: file.rel.to_string(),
        });
    }
    let url = source.url(file)?;
    let dir = dest.parent().unwrap_or(root);
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let part = part_path(&dest);
    let mut have = std::fs::metadata(&part).map_or(0, |m| m.len());
    if have > file.size {
        std::fs::remove_file(&part).map_err(io(&part))?;
        have = 0;
    }
    let resumed_from;
    if have < file.size {
        let mut req = agent().get(&url);
        if have > 0 {
            req = req.set("Range", &format!("bytes={have}-"));
        }
        let http = |msg: String| DataError::Http {
            url: url.clone(),
            msg,
        };
        let resp = match req.call() {
            Ok(r) => r,
            Err(ureq::Error::Status(416, _)) if have > 0 => {
                // The server cannot resume from here: start again.
                std::fs::remove_file(&part).map_err(io(&part))?;
                return fetch_file(root, file, source);
            }
            Err(ureq::Error::Status(code, r)) => {
                return Err(http(format!("HTTP {code} {}", r.status_text())))
            }
            Err(ureq::Error::Transport(t)) => {
                return Err(http(match t.message() {
                    Some(m) => format!("{}: {m}", t.kind()),
                    None => t.kind().to_string(),
                }))
            }
        };
        let append = have > 0 && resp.status() == 206;
        resumed_from = if append { have } else { 0 };
        let mut out = OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(&part)
            .map_err(io(&part))?;
        // Never more than the file's size: one byte more is refused below.
        let room = file.size - resumed_from;
        let mut body = resp.into_reader().take(room + 1);
        let mut buf = vec![0u8; 1 << 16];
        let mut got = 0u64;
        loop {
            let n = body
                .read(&mut buf)
                .map_err(|e| http(format!("reading the body: {e}")))?;
            if n == 0 {
                break;
            }
            got += n as u64;
            if got > room {
                drop(out);
                let _ = std::fs::remove_file(&part);
                return Err(DataError::TooLong {
                    url,
                    rel: file.rel.to_string(),
                    expected: file.size,
                });
            }
            out.write_all(&buf[..n]).map_err(io(&part))?;
        }
        out.sync_all().map_err(io(&part))?;
        if resumed_from + got < file.size {
            return Err(http(format!(
                "the download stopped at {} of {} bytes; run again to resume",
                resumed_from + got,
                file.size
            )));
        }
    } else {
        resumed_from = have;
    }
    let found = sha256_of(&part)?;
    if found != file.sha256 {
        let _ = std::fs::remove_file(&part);
        return Err(DataError::Sha256 {
            url,
            found,
            expected: file.sha256.to_string(),
        });
    }
    std::fs::rename(&part, &dest).map_err(io(&dest))?;
    Ok(Fetched::Downloaded {
        bytes: file.size - resumed_from,
        resumed_from,
    })
}

/// Makes a protocol's data usable under `root` and returns `root`. The cache is filled from
/// the network (or fails naming the first file it cannot get); any other root is a local copy
/// and must already hold the protocol's folder.
pub fn ensure_protocol(root: &Path, protocol: &str) -> Result<PathBuf> {
    if root == cache_root() {
        let source = Source::from_env();
        for file in files_for(protocol)? {
            if let Fetched::Downloaded { bytes, .. } = fetch_file(root, file, &source)? {
                eprintln!("fetched {} ({bytes} bytes)", file.rel);
            }
        }
    } else if !root.join(protocol).is_dir() {
        return Err(DataError::Missing {
            path: root.join(protocol),
            protocol: protocol.to_string(),
        });
    }
    Ok(root.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_consistent() {
        let mut seen = std::collections::HashSet::new();
        for f in FILES {
            assert!(seen.insert(f.rel), "{} twice", f.rel);
            assert!(PROTOCOLS.contains(&f.protocol()), "{}", f.rel);
            assert_eq!(f.sha256.len(), 64, "{}", f.rel);
            assert!(!f.rel.contains(".."), "{}", f.rel);
        }
        for p in PROTOCOLS {
            assert!(!files_for(p).unwrap().is_empty(), "{p}");
        }
        assert!(files_for("toy").is_err());
    }

    #[test]
    fn urls_use_the_mirror_or_the_pinned_commit() {
        let f = FILES
            .iter()
            .find(|f| f.rel == "realmistake/data.zip")
            .unwrap();
        let gh = Source {
            mirror: None,
            offline: false,
        };
        assert_eq!(
            gh.url(f).unwrap(),
            "https://raw.githubusercontent.com/psunlpgroup/ReaLMistake/f94a8b978926414deb1dcf6b50076fd06c892192/data.zip"
        );
        let m = Source {
            mirror: Some("http://127.0.0.1:9/data".into()),
            offline: false,
        };
        assert_eq!(
            m.url(f).unwrap(),
            "http://127.0.0.1:9/data/realmistake/data.zip"
        );
        let table = FILES.iter().find(|f| f.upstream.is_none()).unwrap();
        assert!(matches!(gh.url(table), Err(DataError::NoSource { .. })));
    }

    #[test]
    fn offline_never_downloads() {
        let dir = tempfile::tempdir().unwrap();
        let f = &FILES[0];
        let src = Source {
            mirror: Some("http://127.0.0.1:1".into()),
            offline: true,
        };
        let err = fetch_file(dir.path(), f, &src).unwrap_err();
        assert!(matches!(err, DataError::Offline { .. }), "{err}");
        assert_eq!(status(dir.path(), f), Status::Missing);
    }
}
