//! The few pieces of Python arithmetic that the published FB-Bench numbers depend on,
//! reproduced exactly: ints versus floats, Python 3.12's compensated `sum` and `round`.
//! Nothing FB-Bench specific. How the published CSVs print numbers is the report's
//! (`report::format::shortest`, for [`crate::bench::table::Cell::Float`]).

use std::ops::Add;

use serde_json::Number;

/// A number as the authors' Python held it: an int (0, 1, or a sum of int weights) or a
/// float. The distinction matters because Python's `sum` adds floats with compensation and
/// ints exactly; reproducing the published roundings needs both.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PyNum {
    pub value: f64,
    pub int: bool,
}

impl PyNum {
    pub const ZERO: PyNum = PyNum {
        value: 0.0,
        int: true,
    };
    pub const ONE: PyNum = PyNum {
        value: 1.0,
        int: true,
    };

    pub fn float(value: f64) -> PyNum {
        PyNum { value, int: false }
    }

    /// A JSON number as Python's `json` reads it.
    pub fn from_json(n: &Number) -> PyNum {
        PyNum {
            value: n.as_f64().unwrap_or(f64::NAN),
            int: !n.is_f64(),
        }
    }
}

/// Python's `+`: int + int stays an int, anything else is a float.
impl Add for PyNum {
    type Output = PyNum;
    fn add(self, other: PyNum) -> PyNum {
        PyNum {
            value: self.value + other.value,
            int: self.int && other.int,
        }
    }
}

/// Python 3.12+ `sum(values)` (start 0): exact while the items are ints, then Neumaier
/// compensated summation of floats, ints added plainly. (The published tables were made
/// with it: plain left-to-right sums change one published cell.)
pub fn py_sum(values: impl IntoIterator<Item = PyNum>) -> PyNum {
    let mut values = values.into_iter();
    let mut total = 0.0;
    let first_float = loop {
        match values.next() {
            None => {
                return PyNum {
                    value: total,
                    int: true,
                }
            }
            Some(v) if v.int => total += v.value,
            Some(v) => break v.value,
        }
    };
    let mut hi = total + first_float;
    let mut lo = 0.0;
    for v in values {
        if v.int {
            hi += v.value;
            continue;
        }
        let t = hi + v.value;
        if hi.abs() >= v.value.abs() {
            lo += (hi - t) + v.value;
        } else {
            lo += (v.value - t) + hi;
        }
        hi = t;
    }
    if lo != 0.0 && lo.is_finite() {
        hi += lo;
    }
    PyNum::float(hi)
}

/// Python's `round(x, digits)`: half to even on the exact binary value.
pub fn py_round(x: f64, digits: usize) -> f64 {
    if !x.is_finite() {
        return x;
    }
    format!("{x:.digits$}").parse().unwrap_or(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn py_sum_is_python_312_sum() {
        // Published cell DeepSeek-V3 / Text Extraction hinges on this: plain summation
        // of these gives 0.6937500000000001, Python 3.12 gives 0.69375.
        let xs = [0.1; 10];
        let plain: f64 = xs.iter().sum();
        assert_eq!(plain, 0.9999999999999999);
        assert_eq!(py_sum(xs.map(PyNum::float)), PyNum::float(1.0)); // Python 3.12: 1.0
        let ints = [PyNum::ONE, PyNum::ONE, PyNum::ZERO];
        assert_eq!(
            py_sum(ints),
            PyNum {
                value: 2.0,
                int: true
            }
        );
        assert_eq!(py_sum([]), PyNum::ZERO);
    }

    #[test]
    fn py_round_is_half_even_on_the_binary_value() {
        assert_eq!(py_round(0.125, 2), 0.12);
        assert_eq!(py_round(0.375, 2), 0.38);
        assert_eq!(py_round(2.675, 2), 2.67); // 2.67499999... in binary
        assert_eq!(py_round(py_round(0.742_35, 4) * 100.0, 2), 74.23);
        assert_eq!(py_round(0.7424 * 100.0, 2), 74.24);
    }
}
