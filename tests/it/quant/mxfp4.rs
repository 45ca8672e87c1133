//! The MXFP4 quantizer that llama.cpp's `llama-quantize` runs (ggml's `quantize_row_mxfp4_ref`,
//! the same in `quantize_mxfp4`), step by step in f32, so that tests make MXFP4 tensors with the
//! very bytes llama.cpp writes. Shared by `tests/it` and the unit tests of `model::quant`
//! (included there by path). Checked against gguf-py's quantizer in
//! `model::quant::tests::mxfp4_quantizer_matches_gguf_py`.

/// Elements per MXFP4 block.
pub(crate) const QK_MXFP4: usize = 32;
/// Bytes per MXFP4 block: the E8M0 exponent, then 16 bytes of codes.
pub(crate) const BLOCK_MXFP4: usize = 17;

/// ggml's `kvalues_mxfp4`: the E2M1 values, doubled.
const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// ggml's `ggml_e8m0_to_fp32_half`: `2^(e - 128)`.
fn e8m0_half(e: u8) -> f32 {
    f32::from_bits(if e < 2 {
        0x0020_0000 << e
    } else {
        (e as u32 - 1) << 23
    })
}

/// ggml's `best_index_mxfp4`: the first code with the least `|kvalue · d - x|`.
fn best_index(x: f32, d: f32) -> u8 {
    let mut best = 0;
    let mut best_err = (KVALUES[0] as f32 * d - x).abs();
    for (i, &k) in KVALUES.iter().enumerate().skip(1) {
        let err = (k as f32 * d - x).abs();
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

/// `x` (a whole number of 32-element blocks) as MXFP4 blocks, as `quantize_row_mxfp4_ref`
/// writes them: `e = floor(log2(amax)) - 2 + 127` (0 for an all-zero block), codes by
/// [`best_index`] against `d = e8m0_half(e)`, element `j` in the low nibble of byte `j` and
/// element `16 + j` in its high nibble.
///
/// # Panics
/// If `x.len()` is not a multiple of 32.
pub(crate) fn quantize(x: &[f32]) -> Vec<u8> {
    assert!(x.len().is_multiple_of(QK_MXFP4), "{} values", x.len());
    let mut out = Vec::with_capacity(x.len() / QK_MXFP4 * BLOCK_MXFP4);
    for b in x.chunks_exact(QK_MXFP4) {
        let mut amax = 0f32;
        for &v in b {
            if amax < v.abs() {
                amax = v.abs();
            }
        }
        // C: (uint8_t) (floorf(log2f(amax)) - 2 + 127), in f32; glibc's log2f as in ggml.
        let e = if amax > 0.0 {
            (amax.log2().floor() - 2.0 + 127.0) as u8
        } else {
            0
        };
        let d = e8m0_half(e);
        out.push(e);
        for j in 0..QK_MXFP4 / 2 {
            out.push(best_index(b[j], d) | (best_index(b[QK_MXFP4 / 2 + j], d) << 4));
        }
    }
    out
}
