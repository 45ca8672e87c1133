//! `--model org/repo…` against a Hub served from this process (`HF_ENDPOINT`): the listing
//! and file routes hf-hub calls, over plain HTTP/1.1 on 127.0.0.1. A split GGUF picked by its
//! quantization downloads every split and replies as the whole file does; a checkpoint of an
//! architecture Candor does not load is refused before its weights are requested.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use crate::util::{self, write_gguf_split};

/// A Hub of one repository, `org/<repo>`, with these files; the paths it was asked for
/// (file requests only, once per file and kind) are in `asked`.
struct FakeHub {
    endpoint: String,
    asked: Arc<Mutex<Vec<String>>>,
}

impl FakeHub {
    fn serve(repo: &str, files: BTreeMap<String, Vec<u8>>) -> FakeHub {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
        let asked = Arc::new(Mutex::new(Vec::new()));
        let log = asked.clone();
        let repo = format!("org/{repo}");
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                let mut range = None;
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                    if let Some(v) = h.to_ascii_lowercase().strip_prefix("range: bytes=") {
                        range = Some(v.trim().to_string());
                    }
                }
                let listing = format!("/api/models/{repo}/revision/main");
                let prefix = format!("/{repo}/resolve/main/");
                let (status, headers, body) = if path == listing {
                    let siblings: Vec<serde_json::Value> = (files.keys())
                        .map(|f| serde_json::json!({ "rfilename": f }))
                        .collect();
                    let json = serde_json::json!({"sha": "0123abcd", "siblings": siblings});
                    ("200 OK", String::new(), json.to_string().into_bytes())
                } else if let Some(bytes) = path.strip_prefix(&prefix).and_then(|f| files.get(f)) {
                    let file = path.strip_prefix(&prefix).unwrap_or_default().to_string();
                    let start = match range.as_deref() {
                        Some("0-0") => {
                            log.lock().expect("log").push(format!("head {file}"));
                            None
                        }
                        Some(r) => {
                            log.lock().expect("log").push(format!("get {file}"));
                            r.trim_end_matches('-').parse::<usize>().ok()
                        }
                        None => Some(0),
                    };
                    let tag = format!("{:016x}", file.len() * 1_000_003 + bytes.len());
                    let (from, to) = match start {
                        None => (0, 1.min(bytes.len())),
                        Some(s) => (s.min(bytes.len()), bytes.len()),
                    };
                    let headers = format!(
                        "ETag: \"{tag}\"\r\nX-Repo-Commit: 0123abcd\r\nContent-Range: bytes \
                         {from}-{}/{}\r\n",
                        to.max(1) - 1,
                        bytes.len()
                    );
                    ("206 Partial Content", headers, bytes[from..to].to_vec())
                } else {
                    ("404 Not Found", String::new(), b"no such file".to_vec())
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes());
                let _ = stream.write_all(&body);
                let _ = stream.flush();
            }
        });
        FakeHub { endpoint, asked }
    }

    fn asked(&self) -> Vec<String> {
        self.asked.lock().expect("log").clone()
    }
}

/// `candor generate` of one chat prompt with `model`, its Hub cache in `home/hf`: against the
/// Hub at `endpoint`, or with `HF_HUB_OFFLINE=1` from the cache alone (`None`). The reply's
/// token ids, or stderr.
pub(crate) fn generate(
    home: &Path,
    model: &str,
    endpoint: Option<&str>,
) -> Result<serde_json::Value, String> {
    let prompts = home.join("prompts.jsonl");
    std::fs::write(
        &prompts,
        r#"{"id": "a", "messages": [{"role": "user", "content": "What is the capital of France?"}]}"#,
    )
    .expect("prompts");
    let out = home.join("replies.jsonl");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_candor"));
    cmd.args(["generate", "--max-new-tokens", "12", "--model", model])
        .arg("--prompts")
        .arg(&prompts)
        .arg("--out")
        .arg(&out)
        .env("HF_HOME", home.join("hf"))
        .env_remove("HF_TOKEN");
    match endpoint {
        Some(e) => cmd.env("HF_ENDPOINT", e).env_remove("HF_HUB_OFFLINE"),
        None => cmd.env("HF_HUB_OFFLINE", "1"),
    };
    let run = cmd.output().expect("candor generate");
    if !run.status.success() {
        return Err(String::from_utf8_lossy(&run.stderr).into_owned());
    }
    let line = std::fs::read_to_string(&out).expect("replies");
    let v: serde_json::Value = serde_json::from_str(line.trim()).expect("json");
    Ok(v["output_ids"].clone())
}

/// The default model as a split set in a folder of a repository that also holds another
/// quantization and a vision projector: `org/repo:q4_1` downloads the three splits (not the
/// others) and replies as the whole file does, and `org/repo` alone names the two models.
#[test]
fn a_split_model_picked_by_its_quantization_downloads_every_split() {
    let Some(whole) = util::default_model() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let (md, tensors) = crate::split::parts_of(&whole);
    let splits = dir.path().join("splits");
    std::fs::create_dir_all(&splits).expect("dir");
    let written = write_gguf_split(&splits, "smol-Q4_1", &md, &tensors, 3, false, |_, _| {});
    let mut files = BTreeMap::new();
    for p in &written {
        let name = p.file_name().expect("name").to_string_lossy();
        files.insert(format!("Q4_1/{name}"), std::fs::read(p).expect("split"));
    }
    files.insert("smol-Q8_0.gguf".into(), b"not fetched".to_vec());
    files.insert("mmproj-smol-F16.gguf".into(), b"not fetched".to_vec());
    let hub = FakeHub::serve("smol", files);

    let home = dir.path().join("whole");
    std::fs::create_dir_all(&home).expect("home");
    let want = generate(&home, whole.to_str().expect("utf-8"), None).expect("the whole file");
    let home = dir.path().join("hub");
    std::fs::create_dir_all(&home).expect("home");
    assert_eq!(
        generate(&home, "org/smol:q4_1", Some(&hub.endpoint)),
        Ok(want)
    );
    let fetched: Vec<String> = (hub.asked().into_iter())
        .filter_map(|a| a.strip_prefix("get ").map(str::to_string))
        .collect();
    assert_eq!(
        fetched,
        (1..=3)
            .map(|i| format!("Q4_1/smol-Q4_1-0000{i}-of-00003.gguf"))
            .collect::<Vec<_>>()
    );
    let e = generate(&home, "org/smol", Some(&hub.endpoint)).expect_err("two models");
    assert!(
        e.contains("2 .gguf models") && e.contains("smol-Q8_0.gguf") && !e.contains("mmproj"),
        "{e}"
    );
}

/// A safetensors checkpoint whose `config.json` names an architecture Candor loads only from
/// GGUF (DeepSeek-V3) is refused with the reason, and its weights are never requested.
#[test]
fn a_checkpoint_candor_cannot_load_is_refused_before_its_weights_download() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = serde_json::json!({"model_type": "deepseek_v3", "num_hidden_layers": 61});
    let files: BTreeMap<String, Vec<u8>> = [
        ("config.json", config.to_string().into_bytes()),
        ("model.safetensors", vec![7u8; 4096]),
        ("tokenizer.json", b"{}".to_vec()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let hub = FakeHub::serve("ck", files);
    let e = generate(dir.path(), "org/ck", Some(&hub.endpoint)).expect_err("refused");
    let asked = hub.asked();
    assert!(
        e.contains("deepseek_v3") && e.contains("before downloading the weights"),
        "{e} (asked: {asked:?})"
    );
    assert!(
        asked.iter().any(|a| a == "get config.json"),
        "the config was fetched: {asked:?}"
    );
    assert!(
        !asked.iter().any(|a| a.contains("safetensors")),
        "the weights were requested: {asked:?}"
    );
}
