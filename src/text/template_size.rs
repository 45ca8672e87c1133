//! Sizes a chat template's values before they are built, so that one step that would build a
//! huge value (`'a' * 10**10`, `x | indent(10**9)`, `s.replace('a', long)`) is refused with a
//! typed error instead of allocating.
//!
//! Two places build values from a template. minijinja folds constant expressions while it
//! compiles (`'a' * 10**10` is computed then, before any budget is active and before a message
//! is rendered), so [`check_folding`] parses the source and sizes every expression the compiler
//! would fold, without folding it. While rendering, the filters and string methods whose result
//! size follows from their arguments (`indent`, `replace`, `join`, `batch`) are registered by
//! [`register`] in checked versions that compare that size with what the thread's memory
//! budget ([`crate::budget::alloc_budget`]) has left. The filters that walk a sequence (`unique`,
//! `list`, `sort`, `sum`, …) are registered in versions that first compare its length with the
//! instructions the render has left: minijinja charges no fuel for the items a filter walks,
//! and `[1] * n` is a lazy sequence of any length, so `([1] * n) | unique` would otherwise walk
//! 10⁹ items on one instruction. This module does not bound output (the output cap in
//! [`super::chat_template`] does) and it is not a sandbox: values that grow step by step are
//! left to the memory budget.

use std::borrow::Cow;

use minijinja::machinery::ast::{BinOpKind, CallArg, Expr, Stmt, UnaryOpKind};
use minijinja::value::ValueKind;
use minijinja::value::{Kwargs, Rest};
use minijinja::{Environment, Error, ErrorKind, State, Value};

/// Marks errors raised by a size check, so the renderer reports them as a budget error.
pub const OVER_BUDGET: &str = "\u{1}over budget\u{1}";

/// The largest value the compiler may fold from constants.
pub const MAX_FOLDED: u128 = 1 << 20;

/// Bytes the compiler may copy in all while folding (it folds a constant again for every
/// enclosing expression it tries to fold).
const MAX_FOLD_WORK: u128 = 64 << 20;

/// Bytes counted for a value that is not a string (a number, `none`, an item of a list).
const SCALAR: u128 = 24;

/// What a constant expression folds to, as far as its size goes.
#[derive(Clone, Copy)]
enum Folded {
    Str(u128),
    Int(i128),
    Float(f64),
    /// A sequence: items, and the bytes of its text form.
    Seq(u128, u128),
    Other(u128),
}

impl Folded {
    fn bytes(self) -> u128 {
        match self {
            Folded::Str(n) | Folded::Seq(_, n) | Folded::Other(n) => n,
            Folded::Int(_) | Folded::Float(_) => SCALAR,
        }
    }

    fn truthy(self) -> bool {
        match self {
            Folded::Str(n) | Folded::Seq(n, _) => n > 0,
            Folded::Int(i) => i != 0,
            Folded::Float(f) => f != 0.0,
            Folded::Other(_) => true,
        }
    }

    /// A repetition count, as minijinja reads one (`as_usize`).
    fn count(self) -> Option<u128> {
        match self {
            Folded::Int(i) => u128::try_from(i).ok(),
            Folded::Float(f) if f >= 0.0 && f.fract() == 0.0 => Some(f as u128),
            _ => None,
        }
    }
}

/// Checks that no expression in `source` folds, at compile time, to more than [`MAX_FOLDED`]
/// bytes, nor all folding to more than [`MAX_FOLD_WORK`]. A source that does not parse passes
/// (compiling it reports the syntax error). The error says what would have been built.
pub fn check_folding(source: &str) -> Result<(), String> {
    let Ok(ast) = minijinja::machinery::parse(
        source,
        "chat_template",
        Default::default(),
        Default::default(),
    ) else {
        return Ok(());
    };
    let mut work = 0u128;
    stmt(&ast, &mut work)?;
    if work > MAX_FOLD_WORK {
        return Err(format!(
            "constant expressions that take {work} bytes of copying to fold (at most {MAX_FOLD_WORK})"
        ));
    }
    Ok(())
}

fn stmts(list: &[Stmt<'_>], work: &mut u128) -> Result<(), String> {
    list.iter().try_for_each(|s| stmt(s, work))
}

fn stmt(s: &Stmt<'_>, work: &mut u128) -> Result<(), String> {
    match s {
        Stmt::Template(t) => stmts(&t.children, work),
        Stmt::EmitExpr(x) => expr(&x.expr, 0, work),
        Stmt::ForLoop(f) => {
            expr(&f.target, 0, work)?;
            expr(&f.iter, 0, work)?;
            if let Some(x) = &f.filter_expr {
                expr(x, 0, work)?;
            }
            stmts(&f.body, work)?;
            stmts(&f.else_body, work)
        }
        Stmt::IfCond(c) => {
            expr(&c.expr, 0, work)?;
            stmts(&c.true_body, work)?;
            stmts(&c.false_body, work)
        }
        Stmt::WithBlock(w) => {
            for (a, b) in &w.assignments {
                expr(a, 0, work)?;
                expr(b, 0, work)?;
            }
            stmts(&w.body, work)
        }
        Stmt::Set(x) => {
            expr(&x.target, 0, work)?;
            expr(&x.expr, 0, work)
        }
        Stmt::SetBlock(x) => {
            expr(&x.target, 0, work)?;
            if let Some(f) = &x.filter {
                expr(f, 0, work)?;
            }
            stmts(&x.body, work)
        }
        Stmt::AutoEscape(x) => {
            expr(&x.enabled, 0, work)?;
            stmts(&x.body, work)
        }
        Stmt::FilterBlock(x) => {
            expr(&x.filter, 0, work)?;
            stmts(&x.body, work)
        }
        Stmt::Block(b) => stmts(&b.body, work),
        Stmt::Import(x) => {
            expr(&x.expr, 0, work)?;
            expr(&x.name, 0, work)
        }
        Stmt::FromImport(x) => {
            expr(&x.expr, 0, work)?;
            for (a, b) in &x.names {
                expr(a, 0, work)?;
                if let Some(b) = b {
                    expr(b, 0, work)?;
                }
            }
            Ok(())
        }
        Stmt::Extends(x) => expr(&x.name, 0, work),
        Stmt::Include(x) => expr(&x.name, 0, work),
        Stmt::Macro(m) => {
            for x in m.args.iter().chain(&m.defaults) {
                expr(x, 0, work)?;
            }
            stmts(&m.body, work)
        }
        Stmt::CallBlock(c) => {
            expr(&c.call.expr, 0, work)?;
            c.call.args.iter().try_for_each(|a| arg(a, 0, work))?;
            for x in c.macro_decl.args.iter().chain(&c.macro_decl.defaults) {
                expr(x, 0, work)?;
            }
            stmts(&c.macro_decl.body, work)
        }
        Stmt::Do(d) => {
            expr(&d.call.expr, 0, work)?;
            d.call.args.iter().try_for_each(|a| arg(a, 0, work))
        }
        #[allow(unreachable_patterns)]
        _ => Ok(()),
    }
}

fn arg(a: &CallArg<'_>, depth: u128, work: &mut u128) -> Result<(), String> {
    match a {
        CallArg::Pos(x) | CallArg::Kwarg(_, x) | CallArg::PosSplat(x) | CallArg::KwargSplat(x) => {
            expr(x, depth, work)
        }
    }
}

/// Sizes `x` and everything under it; `depth` is how many enclosing expressions the compiler
/// tries to fold before reaching `x` (each folds `x` again).
fn expr(x: &Expr<'_>, depth: u128, work: &mut u128) -> Result<(), String> {
    if let Some(f) = fold(x)? {
        *work = work.saturating_add(f.bytes().saturating_mul(depth + 1));
    }
    let d = depth + 1;
    match x {
        Expr::Var(_) | Expr::Const(_) => Ok(()),
        Expr::Slice(s) => {
            expr(&s.expr, d, work)?;
            for y in [&s.start, &s.stop, &s.step].into_iter().flatten() {
                expr(y, d, work)?;
            }
            Ok(())
        }
        Expr::UnaryOp(u) => expr(&u.expr, d, work),
        Expr::BinOp(b) => {
            if matches!(b.op, BinOpKind::Mul) {
                repetition(&b.left, &b.right)?;
            }
            expr(&b.left, d, work)?;
            expr(&b.right, d, work)
        }
        Expr::IfExpr(i) => {
            expr(&i.test_expr, d, work)?;
            expr(&i.true_expr, d, work)?;
            if let Some(y) = &i.false_expr {
                expr(y, d, work)?;
            }
            Ok(())
        }
        Expr::Filter(f) => {
            if let Some(y) = &f.expr {
                expr(y, d, work)?;
            }
            f.args.iter().try_for_each(|a| arg(a, d, work))
        }
        Expr::Test(t) => {
            expr(&t.expr, d, work)?;
            t.args.iter().try_for_each(|a| arg(a, d, work))
        }
        Expr::GetAttr(g) => expr(&g.expr, d, work),
        Expr::GetItem(g) => {
            expr(&g.expr, d, work)?;
            expr(&g.subscript_expr, d, work)
        }
        Expr::Call(c) => {
            expr(&c.expr, d, work)?;
            c.args.iter().try_for_each(|a| arg(a, d, work))
        }
        Expr::List(l) => l.items.iter().try_for_each(|y| expr(y, d, work)),
        Expr::Map(m) => m
            .keys
            .iter()
            .chain(m.values.iter())
            .try_for_each(|y| expr(y, d, work)),
    }
}

/// The most times a value that may be a sequence may be repeated by `*` with a constant count.
const MAX_REPEAT: i128 = 100;

/// What an expression evaluates to, as far as its text shows.
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    Number,
    Text,
    Sequence,
    Unknown,
}

fn shape(x: &Expr<'_>) -> Shape {
    const NUMBER_FILTERS: &[&str] = &[
        "int",
        "float",
        "length",
        "count",
        "abs",
        "round",
        "wordcount",
    ];
    const TEXT_FILTERS: &[&str] = &[
        "string",
        "lower",
        "upper",
        "trim",
        "title",
        "capitalize",
        "replace",
        "join",
        "indent",
        "format",
        "striptags",
        "safe",
        "escape",
        "e",
        "tojson",
        "center",
        "urlencode",
    ];
    match x {
        Expr::Const(c) => match c.value.kind() {
            ValueKind::String => Shape::Text,
            ValueKind::Number | ValueKind::Bool => Shape::Number,
            _ => Shape::Unknown,
        },
        Expr::List(_) => Shape::Sequence,
        Expr::Filter(f) if NUMBER_FILTERS.contains(&f.name) => Shape::Number,
        Expr::Filter(f) if TEXT_FILTERS.contains(&f.name) => Shape::Text,
        Expr::GetAttr(g) if matches!(&g.expr, Expr::Var(v) if v.id == "loop") => Shape::Number,
        Expr::Call(c) if matches!(&c.expr, Expr::Var(v) if v.id == "range") => Shape::Sequence,
        Expr::UnaryOp(u) => match u.op {
            UnaryOpKind::Not => Shape::Number,
            UnaryOpKind::Neg => shape(&u.expr),
        },
        Expr::BinOp(b) => match b.op {
            BinOpKind::Concat => Shape::Text,
            BinOpKind::Eq
            | BinOpKind::Ne
            | BinOpKind::Lt
            | BinOpKind::Lte
            | BinOpKind::Gt
            | BinOpKind::Gte
            | BinOpKind::In => Shape::Number,
            BinOpKind::Add
            | BinOpKind::Sub
            | BinOpKind::Mul
            | BinOpKind::Div
            | BinOpKind::FloorDiv
            | BinOpKind::Rem
            | BinOpKind::Pow
                if shape(&b.left) == Shape::Number && shape(&b.right) == Shape::Number =>
            {
                Shape::Number
            }
            _ => Shape::Unknown,
        },
        _ => Shape::Unknown,
    }
}

/// Refuses `left * right` where one side may be a sequence and the count is not a constant of
/// at most [`MAX_REPEAT`]. minijinja repeats a sequence lazily, so `[1] * n` costs nothing
/// until something walks it; an operator such as `x in [1] * n` then walks `n` items on one
/// instruction, out of reach of fuel and of the memory budget. Strings are repeated eagerly
/// (the memory budget bounds them) and numbers multiply; chat templates repeat little else.
fn repetition(left: &Expr<'_>, right: &Expr<'_>) -> Result<(), String> {
    let (l, r) = (shape(left), shape(right));
    if l == Shape::Text || r == Shape::Text || (l == Shape::Number && r == Shape::Number) {
        return Ok(());
    }
    let count = |x: &Expr<'_>| match fold(x) {
        Ok(Some(Folded::Int(c))) => Some(c),
        _ => None,
    };
    match (count(left), count(right)) {
        (Some(c), _) | (_, Some(c)) if c.abs() <= MAX_REPEAT => Ok(()),
        (Some(c), _) | (_, Some(c)) => Err(format!(
            "`*` repeats a value that may be a sequence {c} times (at most {MAX_REPEAT})"
        )),
        _ => Err(format!(
            "`*` repeats a value that may be a sequence a number of times known only when \
             rendering (sequences may be repeated by a constant of at most {MAX_REPEAT})"
        )),
    }
}

/// What the compiler would fold `x` to (`None`: it would not fold it), mirroring minijinja's
/// `Expr::as_const`; refuses a value over [`MAX_FOLDED`] before anything is built.
fn fold(x: &Expr<'_>) -> Result<Option<Folded>, String> {
    let konst = |y: &Expr<'_>| match y {
        Expr::Const(c) => Some(constant(&c.value)),
        _ => None,
    };
    let f = match x {
        Expr::Const(c) => constant(&c.value),
        Expr::List(l) => {
            let items: Option<Vec<Folded>> = l.items.iter().map(konst).collect();
            let Some(items) = items else { return Ok(None) };
            let bytes = items.iter().map(|f| f.bytes() + 2).sum::<u128>() + 2;
            Folded::Seq(items.len() as u128, bytes)
        }
        Expr::Map(m) => {
            let items: Option<Vec<Folded>> = m.keys.iter().chain(&m.values).map(konst).collect();
            let Some(items) = items else { return Ok(None) };
            Folded::Other(items.iter().map(|f| f.bytes() + 2).sum::<u128>() + 2)
        }
        Expr::UnaryOp(u) => match (fold(&u.expr)?, &u.op) {
            (None, _) => return Ok(None),
            (Some(v), UnaryOpKind::Not) => Folded::Int(i128::from(!v.truthy())),
            (Some(Folded::Int(i)), UnaryOpKind::Neg) => Folded::Int(i.wrapping_neg()),
            (Some(Folded::Float(v)), UnaryOpKind::Neg) => Folded::Float(-v),
            (Some(_), UnaryOpKind::Neg) => return Ok(None),
        },
        Expr::BinOp(b) => {
            let (Some(l), Some(r)) = (fold(&b.left)?, fold(&b.right)?) else {
                return Ok(None);
            };
            match binop(&b.op, l, r) {
                Some(f) => f,
                None => return Ok(None),
            }
        }
        _ => return Ok(None),
    };
    let (bytes, what) = match f {
        Folded::Seq(items, bytes) => (items.saturating_mul(SCALAR).max(bytes), "a sequence"),
        Folded::Str(n) => (n, "a string"),
        other => (other.bytes(), "a value"),
    };
    if bytes > MAX_FOLDED {
        return Err(format!(
            "a constant expression folds to {what} of {bytes} bytes (at most {MAX_FOLDED})"
        ));
    }
    Ok(Some(f))
}

fn constant(v: &Value) -> Folded {
    match v.kind() {
        ValueKind::String => Folded::Str(v.as_str().map_or(0, str::len) as u128),
        ValueKind::Bool => Folded::Int(i128::from(v.is_true())),
        ValueKind::Number => match v.as_i64() {
            Some(i) => Folded::Int(i128::from(i)),
            None => match i128::try_from(v.clone()) {
                Ok(i) => Folded::Int(i),
                Err(_) => Folded::Float(f64::try_from(v.clone()).unwrap_or(0.0)),
            },
        },
        _ => Folded::Other(SCALAR),
    }
}

fn binop(op: &BinOpKind, l: Folded, r: Folded) -> Option<Folded> {
    use Folded::*;
    let float = |f: &dyn Fn(f64, f64) -> f64| {
        let x = |v: Folded| match v {
            Int(i) => Some(i as f64),
            Float(f) => Some(f),
            _ => None,
        };
        Some(Float(f(x(l)?, x(r)?)))
    };
    Some(match (op, l, r) {
        (BinOpKind::Mul, Str(n), c) | (BinOpKind::Mul, c, Str(n)) => {
            Str(n.saturating_mul(c.count()?))
        }
        (BinOpKind::Mul, Seq(i, b), c) | (BinOpKind::Mul, c, Seq(i, b)) => {
            let c = c.count()?;
            Seq(i.saturating_mul(c), b.saturating_mul(c))
        }
        (BinOpKind::Mul, Int(a), Int(b)) => Int(a.checked_mul(b)?),
        (BinOpKind::Mul, ..) => return float(&|a, b| a * b),
        (BinOpKind::Add, Str(a), Str(b)) => Str(a.saturating_add(b)),
        (BinOpKind::Add, Seq(a, x), Seq(b, y)) => Seq(a.saturating_add(b), x.saturating_add(y)),
        (BinOpKind::Add, Int(a), Int(b)) => Int(a.checked_add(b)?),
        (BinOpKind::Add, ..) => return float(&|a, b| a + b),
        (BinOpKind::Sub, Int(a), Int(b)) => Int(a.checked_sub(b)?),
        (BinOpKind::Sub, ..) => return float(&|a, b| a - b),
        (BinOpKind::Div, ..) => return float(&|a, b| a / b),
        (BinOpKind::FloorDiv, Int(a), Int(b)) => Int(a.checked_div_euclid(b)?),
        (BinOpKind::Rem, Int(a), Int(b)) => Int(a.checked_rem_euclid(b)?),
        (BinOpKind::FloorDiv | BinOpKind::Rem, ..) => return float(&|a, b| a % b),
        (BinOpKind::Pow, Int(a), Int(b)) => Int(a.checked_pow(u32::try_from(b).ok()?)?),
        (BinOpKind::Pow, ..) => return float(&f64::powf),
        (BinOpKind::Concat, a, b) => Str(a.bytes().saturating_add(b.bytes())),
        (BinOpKind::ScAnd, a, b) => {
            if a.truthy() && b.truthy() {
                b
            } else {
                Int(0)
            }
        }
        (BinOpKind::ScOr, a, b) => {
            if a.truthy() {
                a
            } else {
                b
            }
        }
        (
            BinOpKind::Eq
            | BinOpKind::Ne
            | BinOpKind::Lt
            | BinOpKind::Lte
            | BinOpKind::Gt
            | BinOpKind::Gte
            | BinOpKind::In,
            ..,
        ) => Int(0),
    })
}

/// The error a size check raises: `what` would need `bytes`, more than the budget has left.
fn over(what: &str, bytes: u128, left: isize) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!(
            "{OVER_BUDGET}{what} would build {bytes} bytes, more than the {} MiB left of the memory budget",
            left.max(0) >> 20
        ),
    )
}

/// Refuses `bytes` for `what` if it exceeds what this thread's memory budget has left.
fn check(what: &str, bytes: u128) -> Result<(), Error> {
    match crate::budget::alloc_budget::remaining() {
        Some(left) if bytes > left.max(0) as u128 => Err(over(what, bytes, left)),
        _ => Ok(()),
    }
}

/// Refuses a filter that would walk more items of `v` than the render has instructions left
/// (each item walked counts as one instruction, as one turn of a `for` loop does).
fn walk(state: &State, what: &str, v: &Value) -> Result<(), Error> {
    let n = items(v);
    match state.fuel_levels() {
        Some((_, left)) if n > left as u128 => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "{OVER_BUDGET}{what} would walk {n} items, more than the {left} instructions left"
            ),
        )),
        _ => Ok(()),
    }
}

/// The length a value has when iterated, where known without iterating.
fn items(v: &Value) -> u128 {
    if let Some(s) = v.as_str() {
        return s.chars().count() as u128;
    }
    v.len().unwrap_or(0) as u128
}

/// Registers the size-checked filters and wraps the string methods of `pycompat`.
pub fn register(env: &mut Environment<'_>) {
    env.add_filter(
        "indent",
        |value: String,
         width: usize,
         first: Option<bool>,
         blank: Option<bool>|
         -> Result<String, Error> {
            let lines = value.bytes().filter(|&b| b == b'\n').count() as u128 + 1;
            let bytes = (value.len() as u128).saturating_add(lines.saturating_mul(width as u128));
            check("indent", bytes.max(width as u128))?;
            Ok(minijinja::filters::indent(value, width, first, blank))
        },
    );
    env.add_filter(
        "replace",
        |state: &State, v: Cow<'_, str>, from: Cow<'_, str>, to: Cow<'_, str>| {
            check("replace", replaced_size(&v, &from, &to, None))?;
            Ok::<_, Error>(minijinja::filters::replace(state, v, from, to))
        },
    );
    env.add_filter(
        "join",
        |state: &State, val: &Value, joiner: Option<Cow<'_, str>>| -> Result<String, Error> {
            walk(state, "join", val)?;
            let sep = joiner.as_deref().map_or(0, str::len) as u128;
            check("join", items(val).saturating_sub(1).saturating_mul(sep))?;
            minijinja::filters::join(val, joiner)
        },
    );
    env.add_filter(
        "batch",
        |state: &State, value: Value, count: usize, fill: Option<Value>| {
            walk(state, "batch", &value)?;
            check("batch", (count as u128).saturating_mul(SCALAR))?;
            minijinja::filters::batch(state, value, count, fill)
        },
    );
    register_walking(env);
    env.set_unknown_method_callback(|state, value, method, args| {
        if let Some(s) = value.as_str() {
            match (method, args) {
                ("replace", [old, new, rest @ ..]) => {
                    if let (Some(old), Some(new)) = (old.as_str(), new.as_str()) {
                        let count = rest.first().and_then(Value::as_i64);
                        check("replace", replaced_size(s, old, new, count))?;
                    }
                }
                ("join", [seq]) => {
                    let sep = s.len() as u128;
                    check("join", items(seq).saturating_sub(1).saturating_mul(sep))?;
                }
                _ => {}
            }
        }
        minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
    });
}

/// The sequence-walking builtin filters, each behind [`walk`].
fn register_walking(env: &mut Environment<'_>) {
    use minijinja::filters as f;
    macro_rules! state_value {
        ($($name:ident),*) => {$(
            env.add_filter(stringify!($name), |state: &State, v: Value| {
                walk(state, stringify!($name), &v)?;
                f::$name(state, v)
            });
        )*};
    }
    state_value!(list, sum, min, max);
    macro_rules! state_value_kwargs {
        ($($name:ident),*) => {$(
            env.add_filter(stringify!($name), |state: &State, v: Value, kwargs: Kwargs| {
                walk(state, stringify!($name), &v)?;
                f::$name(state, v, kwargs)
            });
        )*};
    }
    state_value_kwargs!(unique, sort);
    env.add_filter("reverse", |state: &State, v: &Value| {
        walk(state, "reverse", v)?;
        f::reverse(v)
    });
    env.add_filter("last", |state: &State, v: Value| {
        walk(state, "last", &v)?;
        f::last(v)
    });
    env.add_filter(
        "groupby",
        |state: &State, v: Value, attribute: Option<&str>, kwargs: Kwargs| {
            walk(state, "groupby", &v)?;
            f::groupby(v, attribute, kwargs)
        },
    );
    env.add_filter(
        "slice",
        |state: &State, v: Value, count: usize, fill: Option<Value>| {
            walk(state, "slice", &v)?;
            f::slice(state, v, count, fill)
        },
    );
    env.add_filter("map", |state: &State, v: Value, args: Rest<Value>| {
        walk(state, "map", &v)?;
        f::map(state, v, args)
    });
    macro_rules! select_like {
        ($($name:ident),*) => {$(
            env.add_filter(
                stringify!($name),
                |state: &State, v: Value, test: Option<Cow<'_, str>>, args: Rest<Value>| {
                    walk(state, stringify!($name), &v)?;
                    f::$name(state, v, test, args)
                },
            );
        )*};
    }
    select_like!(select, reject);
    macro_rules! attr_like {
        ($($name:ident),*) => {$(
            env.add_filter(
                stringify!($name),
                |state: &State,
                 v: Value,
                 attr: Cow<'_, str>,
                 test: Option<Cow<'_, str>>,
                 args: Rest<Value>| {
                    walk(state, stringify!($name), &v)?;
                    f::$name(state, v, attr, test, args)
                },
            );
        )*};
    }
    attr_like!(selectattr, rejectattr);
}

/// The size of `s` with `from` replaced by `to` (at most `count` times, when non-negative).
fn replaced_size(s: &str, from: &str, to: &str, count: Option<i64>) -> u128 {
    let mut n = if from.is_empty() {
        s.chars().count() as u128 + 1
    } else {
        s.matches(from).count() as u128
    };
    if let Some(c) = count.and_then(|c| u128::try_from(c).ok()) {
        n = n.min(c);
    }
    (s.len() as u128).saturating_add(n.saturating_mul(to.len() as u128))
}

/// `tojson`'s indent: refuses one whose padding alone would exceed the budget.
pub fn check_json_indent(value: &Value, indent: usize) -> Result<(), Error> {
    fn nodes_and_depth(v: &Value, depth: u128, acc: &mut (u128, u128)) {
        acc.0 += 1;
        acc.1 = acc.1.max(depth);
        if acc.0 > 1 << 20 {
            return;
        }
        if matches!(v.kind(), ValueKind::Seq | ValueKind::Map) {
            if let Ok(iter) = v.try_iter() {
                for item in iter {
                    let child = if v.kind() == ValueKind::Map {
                        v.get_item(&item).unwrap_or_default()
                    } else {
                        item
                    };
                    nodes_and_depth(&child, depth + 1, acc);
                }
            }
        }
    }
    if indent == 0 {
        return Ok(());
    }
    let mut acc = (0, 0);
    nodes_and_depth(value, 1, &mut acc);
    check(
        "tojson",
        acc.0.saturating_mul(acc.1).saturating_mul(indent as u128),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folding_is_sized_before_it_is_built() {
        for (src, ok) in [
            ("{{ 'a' * 1000 }}", true),
            ("{{ 'ab' * 10 ~ 'x' }}", true),
            ("{{ [1, 2] * 3 }}", true),
            ("{% if 2 ** 10 > 3 %}x{% endif %}", true),
            ("{{ 'a' * 1000000000 }}", false),
            ("{{ 'a' * 10**18 }}", false),
            ("{{ 10**9 * 'a' }}", false),
            ("{{ 'a' * 1e9 }}", false),
            ("{{ [1, 2, 3] * 1000000000 }}", false),
            ("{{ ([1, 2] * 100000) ~ 'x' }}", false),
            ("{% set x = ('a' or 'b') * 10**9 %}", false),
            (
                "{% for i in range(3) %}{{ x ~ ('a' * 10**8) }}{% endfor %}",
                false,
            ),
            ("{% macro m(a=('a' * 10**8)) %}{% endmacro %}", false),
            ("{{ 'a' * n }}", true),
            ("{% for %}", true),
        ] {
            assert_eq!(
                check_folding(src).is_ok(),
                ok,
                "{src}: {:?}",
                check_folding(src)
            );
        }
        // Folded again for every enclosing expression: 70 levels of 1 MB are refused.
        let mut src = "('a' * 1000000)".to_string();
        for _ in 0..70 {
            src = format!("(x ~ {src})");
        }
        let err = check_folding(&format!("{{{{ {src} }}}}")).unwrap_err();
        assert!(err.contains("bytes of copying"), "{err}");
    }
}
