//! Matrix weights and their row-independent matmuls (temporary portable fallback).
//!
//! Every output element is one dot product with a fixed summation order, so a row's result
//! never depends on how many rows are multiplied together or on the thread count. This file is
//! a simple dequantize-to-f32 stand-in with the same API as the `kernels` branch's quantized
//! kernels, which replace it.

use candle_core::quantized::QTensor;
use candle_core::Device;
use rayon::prelude::*;

/// Errors building a weight matrix.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    #[error("expected a 2-d weight matrix, got shape {0:?}")]
    NotAMatrix(Vec<usize>),
    #[error("cannot dequantize weight: {0}")]
    Candle(#[from] candle_core::Error),
}

pub type Result<T> = std::result::Result<T, QuantError>;

/// Output columns handled by one parallel task.
const COLS_PER_TASK: usize = 64;

fn dequantize(q: &QTensor) -> Result<(usize, usize, Vec<f32>)> {
    let dims = q.shape().dims().to_vec();
    let &[n, k] = dims.as_slice() else {
        return Err(QuantError::NotAMatrix(dims));
    };
    let w = q
        .dequantize(&Device::Cpu)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    Ok((n, k, w))
}

/// Dot product with a fixed order: eight lanes, then a fixed pairwise reduction.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

fn matmul_f32(w: &[f32], n: usize, k: usize, x: &[f32], m: usize, out: &mut [f32]) {
    debug_assert_eq!(x.len(), m * k);
    debug_assert_eq!(out.len(), m * n);
    // Transposed scratch: tasks own disjoint column blocks.
    let mut t = vec![0f32; n * m];
    t.par_chunks_mut(COLS_PER_TASK * m)
        .enumerate()
        .for_each(|(c, chunk)| {
            let j0 = c * COLS_PER_TASK;
            for (jj, col) in chunk.chunks_mut(m).enumerate() {
                let row = &w[(j0 + jj) * k..(j0 + jj + 1) * k];
                for (r, o) in col.iter_mut().enumerate() {
                    *o = dot(&x[r * k..(r + 1) * k], row);
                }
            }
        });
    for r in 0..m {
        for j in 0..n {
            out[r * n + j] = t[j * m + r];
        }
    }
}

/// A weight matrix of `n` output rows of `k` inputs (fallback: held dequantized).
#[derive(Debug, Clone)]
pub struct QWeight {
    n: usize,
    k: usize,
    w: Vec<f32>,
}

impl QWeight {
    pub fn from_qtensor(q: &QTensor) -> Result<QWeight> {
        let (n, k, w) = dequantize(q)?;
        Ok(QWeight { n, k, w })
    }

    /// `x` holds `m` rows of `k` values; `out` receives `m` rows of `n`.
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) {
        matmul_f32(&self.w, self.n, self.k, x, m, out)
    }
}

/// A dense f32 weight matrix (accuracy reference mode).
#[derive(Debug, Clone)]
pub struct F32Weight {
    n: usize,
    k: usize,
    w: Vec<f32>,
}

impl F32Weight {
    pub fn from_qtensor(q: &QTensor) -> Result<F32Weight> {
        let (n, k, w) = dequantize(q)?;
        Ok(F32Weight { n, k, w })
    }

    /// `x` holds `m` rows of `k` values; `out` receives `m` rows of `n`.
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) {
        matmul_f32(&self.w, self.n, self.k, x, m, out)
    }
}
