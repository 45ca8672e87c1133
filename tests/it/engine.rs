//! Engine tests: the llama forward pass and decode loop on the real default model and on tiny
//! synthetic GGUF files, determinism across batch sizes and thread counts, forks, and
//! agreement with the committed reference fixture.

use std::sync::Arc;

use candor::engine::{Decoder, NoText, SamplingParams, SchedulerConfig, StopReason, TokenRequest};
use candor::model::llama::{Llama, WeightDType};

use crate::util;

fn decoder(dtype: WeightDType, batch_size: usize) -> Option<Decoder> {
    let path = util::default_model()?;
    let model = Llama::from_gguf_path(&path, dtype).expect("load default model");
    let cfg = SchedulerConfig {
        batch_size,
        ..SchedulerConfig::default()
    };
    Some(Decoder::new(Arc::new(model), cfg, vec![2]))
}

/// `<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n`
const FRANCE: [u32; 16] = [
    1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198,
];

#[test]
fn greedy_answers_capital_of_france() {
    // Independently computed with a float64 numpy forward pass over the dequantized weights.
    let expected = [504, 3575, 282, 4649, 314, 7042, 30, 2];
    for dtype in [WeightDType::F32, WeightDType::Native] {
        let Some(mut dec) = decoder(dtype, 1) else {
            return;
        };
        let params = SamplingParams {
            max_new_tokens: 16,
            ..SamplingParams::default()
        };
        let req = TokenRequest::new(FRANCE.to_vec(), params);
        let reply = dec.generate(&[req], &NoText).expect("generate");
        assert_eq!(reply[0].output_ids, expected, "{dtype:?}");
        assert_eq!(reply[0].stop_reason, StopReason::Eos);
    }
}
