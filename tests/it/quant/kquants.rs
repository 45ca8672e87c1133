//! The Q4_K, Q5_K and Q6_K quantizers that llama.cpp's `llama-quantize` runs when it has no
//! importance matrix (ggml's reference row quantizers), written out step by step in f32 in the
//! same order of operations, so that the tests write the very bytes llama.cpp's tools write.
//! candle's own quantizers for these types follow an older, simpler search and give other
//! bytes. ggml builds these functions without FMA (its base library has no `-mfma`), so every
//! product and sum here is a separately rounded f32 operation, as in Rust.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;
use half::f16;

const QK_K: usize = 256;

/// ggml's `nearest_int`: the float rounded half to even, through the bits of `x + 1.5·2²³`
/// (valid for |x| < 2²²).
fn nearest_int(x: f32) -> i32 {
    debug_assert!(x.abs() <= 4_194_303.0, "{x}");
    ((x + 12_582_912.0).to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

fn f16_bits(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_le_bytes()
}

fn f16_value(bytes: [u8; 2]) -> f32 {
    f16::from_le_bytes(bytes).to_f32()
}

/// The steps of the scale search of an asymmetric (scale and min) sub-block.
struct Search {
    nmax: i32,
    rmin: f32,
    rdelta: f32,
    nstep: i32,
}

/// A sub-block's scale and (negated) min minimising the weighted squared error: first the
/// plain range, then `nstep + 1` candidate scales around it, each refit by least squares
/// (ggml's `make_qkx2_quants`). Writes the chosen levels to `levels`.
fn scale_and_min(x: &[f32], w: &[f32], s: &Search, levels: &mut [u8]) -> (f32, f32) {
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = w[0];
    let mut sum_x = sum_w * x[0];
    for (&xi, &wi) in x.iter().zip(w).skip(1) {
        if xi < min {
            min = xi;
        }
        if xi > max {
            max = xi;
        }
        sum_w += wi;
        sum_x += wi * xi;
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        levels.fill(0);
        return (0.0, -min);
    }
    let level = |iscale: f32, xi: f32, min: f32| nearest_int(iscale * (xi - min)).clamp(0, s.nmax);
    let mut iscale = s.nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best = 0.0f32;
    for ((l, &xi), &wi) in levels.iter_mut().zip(x).zip(w) {
        *l = level(iscale, xi, min) as u8;
        let diff = scale * f32::from(*l) + min - xi;
        best += wi * (diff * diff);
    }
    let mut trial = [0u8; 32];
    let trial = &mut trial[..x.len()];
    for is in 0..=s.nstep {
        iscale = (s.rmin + s.rdelta * is as f32 + s.nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for ((t, &xi), &wi) in trial.iter_mut().zip(x).zip(w) {
            let l = level(iscale, xi, min);
            *t = l as u8;
            let l = l as f32;
            sum_l += wi * l;
            sum_l2 += wi * l * l;
            sum_xl += wi * l * xi;
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut err = 0.0f32;
            for ((&t, &xi), &wi) in trial.iter().zip(x).zip(w) {
                let diff = this_scale * f32::from(t) + this_min - xi;
                err += wi * (diff * diff);
            }
            if err < best {
                levels.copy_from_slice(trial);
                best = err;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// The 6-bit scale and min of sub-block `j` from a Q4_K/Q5_K block's 12 packed bytes.
fn unpack_scale_min(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The shared part of Q4_K and Q5_K: eight sub-blocks of 32 with a 6-bit scale and min each
/// under the block's f16 `d` and `dmin`. Returns the header (d, dmin, 12 scale bytes) and the
/// 256 levels in `0..=nmax`.
fn scale_min_block(x: &[f32], s: &Search) -> ([u8; 16], [u8; QK_K]) {
    let mut levels = [0u8; QK_K];
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * (j + 1)];
        let mut sum_x2 = 0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let w: Vec<f32> = xs.iter().map(|v| av_x + v.abs()).collect();
        (scales[j], mins[j]) = scale_and_min(xs, &w, s, &mut levels[32 * j..32 * (j + 1)]);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; 12];
    for j in 0..8 {
        // ggml stores the int in a uint8_t (modulo 256) before clamping to 63.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let d = f16_bits(max_scale / 63.0);
    let dmin = f16_bits(max_min / 63.0);
    for j in 0..8 {
        let (sc, m) = unpack_scale_min(j, &packed);
        let dj = f16_value(d) * f32::from(sc);
        if dj == 0.0 {
            // The search's levels stay.
            continue;
        }
        let dm = f16_value(dmin) * f32::from(m);
        for i in 32 * j..32 * (j + 1) {
            levels[i] = nearest_int((x[i] + dm) / dj).clamp(0, s.nmax) as u8;
        }
    }
    let mut head = [0u8; 16];
    head[..2].copy_from_slice(&d);
    head[2..4].copy_from_slice(&dmin);
    head[4..].copy_from_slice(&packed);
    (head, levels)
}

/// One 256-value Q4_K block (144 bytes: d, dmin, scales, 4-bit levels).
fn q4_k_block(x: &[f32], out: &mut Vec<u8>) {
    let search = Search {
        nmax: 15,
        rmin: -1.0,
        rdelta: 0.1,
        nstep: 20,
    };
    let (head, l) = scale_min_block(x, &search);
    out.extend_from_slice(&head);
    for j in (0..QK_K).step_by(64) {
        out.extend((0..32).map(|i| l[j + i] | (l[j + i + 32] << 4)));
    }
}

/// One 256-value Q5_K block (176 bytes: d, dmin, scales, high bits, low 4 bits).
fn q5_k_block(x: &[f32], out: &mut Vec<u8>) {
    let search = Search {
        nmax: 31,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
    };
    let (head, l) = scale_min_block(x, &search);
    let (mut qh, mut ql) = ([0u8; 32], [0u8; 128]);
    for (pair, j) in (0..QK_K).step_by(64).enumerate() {
        let (m1, m2) = (1u8 << (2 * pair), 2u8 << (2 * pair));
        for i in 0..32 {
            let (mut l1, mut l2) = (l[j + i], l[j + i + 32]);
            if l1 > 15 {
                l1 -= 16;
                qh[i] |= m1;
            }
            if l2 > 15 {
                l2 -= 16;
                qh[i] |= m2;
            }
            ql[32 * pair + i] = l1 | (l2 << 4);
        }
    }
    out.extend_from_slice(&head);
    out.extend_from_slice(&qh);
    out.extend_from_slice(&ql);
}

/// A symmetric 16-value sub-block's scale: levels in `-32..32` (written as `0..64`) for the
/// scale that maximises `(Σ w·x·l)² / Σ w·l²` with `w = x²` over 19 candidates around
/// `-32 / max` (ggml's `make_qx_quants` with its `rmse_type` 1).
fn symmetric_scale(x: &[f32], levels: &mut [i8]) -> f32 {
    const NMAX: i32 = 32;
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < 1e-15 {
        levels.fill(0);
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-NMAX, NMAX - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for &v in x {
            let l = level(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let fill = |iscale: f32, levels: &mut [i8]| {
        for (l, &v) in levels.iter_mut().zip(x) {
            *l = (level(iscale, v) + NMAX) as i8;
        }
    };
    let iscale = -(NMAX as f32) / max;
    fill(iscale, levels);
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        let iscale = -(NMAX as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            fill(iscale, levels);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// One 256-value Q6_K block (210 bytes: low 4 bits, high 2 bits, 16 signed 8-bit scales, d).
fn q6_k_block(x: &[f32], out: &mut Vec<u8>) {
    let mut levels = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
    for (ib, scale) in scales.iter_mut().enumerate() {
        *scale = symmetric_scale(
            &x[16 * ib..16 * (ib + 1)],
            &mut levels[16 * ib..16 * (ib + 1)],
        );
        if scale.abs() > max_abs_scale {
            max_abs_scale = scale.abs();
            max_scale = *scale;
        }
    }
    if max_abs_scale < 1e-15 {
        out.extend_from_slice(&[0u8; 210]);
        return;
    }
    let iscale = -128.0 / max_scale;
    let d = f16_bits(1.0 / iscale);
    let sc: Vec<i8> = scales
        .iter()
        .map(|&s| nearest_int(iscale * s).min(127) as i8)
        .collect();
    for (j, &s) in sc.iter().enumerate() {
        let dj = f16_value(d) * f32::from(s);
        if dj == 0.0 {
            continue;
        }
        for i in 16 * j..16 * (j + 1) {
            levels[i] = (nearest_int(x[i] / dj).clamp(-32, 31) + 32) as i8;
        }
    }
    let l = levels.map(|v| v as u8);
    let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
    for (half, j) in (0..QK_K).step_by(128).enumerate() {
        for i in 0..32 {
            let (a, b, c, e) = (l[j + i], l[j + i + 32], l[j + i + 64], l[j + i + 96]);
            ql[64 * half + i] = (a & 0xf) | ((c & 0xf) << 4);
            ql[64 * half + i + 32] = (b & 0xf) | ((e & 0xf) << 4);
            qh[32 * half + i] = (a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6);
        }
    }
    out.extend_from_slice(&ql);
    out.extend_from_slice(&qh);
    out.extend(sc.iter().map(|&s| s as u8));
    out.extend_from_slice(&d);
}

/// `values` (row-major, `shape`'s last dimension a multiple of 256) quantized to `dtype`
/// (Q4_K, Q5_K or Q6_K) as llama-quantize quantizes without an importance matrix.
pub fn quantize(values: &[f32], shape: &[usize], dtype: GgmlDType) -> QTensor {
    let block: fn(&[f32], &mut Vec<u8>) = match dtype {
        GgmlDType::Q4K => q4_k_block,
        GgmlDType::Q5K => q5_k_block,
        GgmlDType::Q6K => q6_k_block,
        other => panic!("no llama-quantize k-quant quantizer for {other:?}"),
    };
    let width = *shape.last().expect("a shape");
    assert_eq!(
        width % QK_K,
        0,
        "{shape:?}: rows are not whole k-quant blocks"
    );
    let mut bytes = Vec::with_capacity(values.len() / QK_K * dtype.type_size());
    for x in values.chunks_exact(QK_K) {
        block(x, &mut bytes);
    }
    candle_core::quantized::ggml_file::qtensor_from_ggml(
        dtype,
        &bytes,
        shape.to_vec(),
        &Device::Cpu,
    )
    .expect("k-quant tensor")
}

#[test]
fn nearest_int_rounds_half_to_even() {
    for (x, want) in [
        (0.5f32, 0),
        (1.5, 2),
        (2.5, 2),
        (-0.5, 0),
        (-1.5, -2),
        (-2.49, -2),
        (3.51, 4),
        (0.0, 0),
        (-7.0, -7),
    ] {
        assert_eq!(nearest_int(x), want, "{x}");
    }
}
