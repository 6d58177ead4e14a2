//! A small subset of CEL, enough for webhook `matchConditions` and CRD `x-kubernetes-validations`
//! as ovnk uses them.
//!
//! Supported: literals (strings, integers, floats, booleans, null, lists), identifiers and field
//! selection, indexing, `!`, unary `-`, `&&`, `||`, `? :`, `== != < <= > >=`, `in`, `+ - * / %`,
//! `has(a.b)`, `size(x)` / `x.size()`, `string.startsWith/endsWith/contains/matches`,
//! `list.exists/all/exists_one/filter/map(v, expr)`. Anything else is rejected when parsed.

use serde_json::{Value, json};
use std::collections::HashMap;

/// Parsed expression.
#[derive(Debug, Clone)]
pub enum Expr {
    /// Literal.
    Lit(Value),
    /// Variable.
    Ident(String),
    /// `a.b`.
    Select(Box<Expr>, String),
    /// `a[b]`.
    Index(Box<Expr>, Box<Expr>),
    /// `has(a.b)`.
    Has(Box<Expr>),
    /// Global function call (`size`, `string`, `int`).
    Call(String, Vec<Expr>),
    /// Method call or macro.
    Method(Box<Expr>, String, Vec<Expr>),
    /// Unary `!` / `-`.
    Unary(char, Box<Expr>),
    /// Binary operator.
    Binary(String, Box<Expr>, Box<Expr>),
    /// `c ? a : b`.
    Cond(Box<Expr>, Box<Expr>, Box<Expr>),
    /// `[a, b]`.
    List(Vec<Expr>),
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Str(String),
    Int(i64),
    Float(f64),
    Ident(String),
    Op(String),
}

fn lex(s: &str) -> Result<Vec<Tok>, String> {
    let cs: Vec<char> = s.chars().collect();
    let mut i = 0;
    let mut out = Vec::new();
    while i < cs.len() {
        let c = cs[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '"' || c == '\'' {
            let q = c;
            let mut st = String::new();
            i += 1;
            loop {
                let Some(&d) = cs.get(i) else {
                    return Err("unterminated string".into());
                };
                i += 1;
                if d == q {
                    break;
                }
                if d == '\\' {
                    let Some(&e) = cs.get(i) else {
                        return Err("bad escape".into());
                    };
                    i += 1;
                    st.push(match e {
                        'n' => '\n',
                        't' => '\t',
                        other => other,
                    });
                } else {
                    st.push(d);
                }
            }
            out.push(Tok::Str(st));
        } else if c.is_ascii_digit() {
            let start = i;
            while i < cs.len() && (cs[i].is_ascii_digit() || cs[i] == '.') {
                i += 1;
            }
            let t: String = cs[start..i].iter().collect();
            if i < cs.len() && cs[i] == 'u' {
                i += 1;
            }
            if t.contains('.') {
                out.push(Tok::Float(
                    t.parse().map_err(|_| format!("bad number {t}"))?,
                ));
            } else {
                out.push(Tok::Int(t.parse().map_err(|_| format!("bad number {t}"))?));
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < cs.len() && (cs[i].is_alphanumeric() || cs[i] == '_') {
                i += 1;
            }
            out.push(Tok::Ident(cs[start..i].iter().collect()));
        } else {
            let two: String = cs[i..(i + 2).min(cs.len())].iter().collect();
            if ["&&", "||", "==", "!=", "<=", ">="].contains(&two.as_str()) {
                out.push(Tok::Op(two));
                i += 2;
            } else if "!<>+-*/%()[].,?:{}".contains(c) {
                out.push(Tok::Op(c.to_string()));
                i += 1;
            } else {
                return Err(format!("unexpected character '{c}'"));
            }
        }
    }
    Ok(out)
}

struct Parser<'a> {
    toks: &'a [Tok],
    pos: usize,
    allowed_roots: &'a [&'a str],
    bound: Vec<String>,
}

const METHODS: &[&str] = &[
    "startsWith",
    "endsWith",
    "contains",
    "matches",
    "size",
    "exists",
    "all",
    "exists_one",
    "filter",
    "map",
];
const FUNCS: &[&str] = &["size", "string", "int", "has"];

impl Parser<'_> {
    fn peek_op(&self, op: &str) -> bool {
        matches!(self.toks.get(self.pos), Some(Tok::Op(o)) if o == op)
    }
    fn peek_ident(&self, id: &str) -> bool {
        matches!(self.toks.get(self.pos), Some(Tok::Ident(o)) if o == id)
    }
    fn expect(&mut self, op: &str) -> Result<(), String> {
        if self.peek_op(op) {
            self.pos += 1;
            Ok(())
        } else {
            Err(format!("expected '{op}' at token {}", self.pos))
        }
    }
    fn expr(&mut self) -> Result<Expr, String> {
        let c = self.or()?;
        if self.peek_op("?") {
            self.pos += 1;
            let a = self.expr()?;
            self.expect(":")?;
            let b = self.expr()?;
            return Ok(Expr::Cond(Box::new(c), Box::new(a), Box::new(b)));
        }
        Ok(c)
    }
    fn or(&mut self) -> Result<Expr, String> {
        let mut l = self.and()?;
        while self.peek_op("||") {
            self.pos += 1;
            let r = self.and()?;
            l = Expr::Binary("||".into(), Box::new(l), Box::new(r));
        }
        Ok(l)
    }
    fn and(&mut self) -> Result<Expr, String> {
        let mut l = self.rel()?;
        while self.peek_op("&&") {
            self.pos += 1;
            let r = self.rel()?;
            l = Expr::Binary("&&".into(), Box::new(l), Box::new(r));
        }
        Ok(l)
    }
    fn rel(&mut self) -> Result<Expr, String> {
        let l = self.add()?;
        for op in ["==", "!=", "<=", ">=", "<", ">"] {
            if self.peek_op(op) {
                self.pos += 1;
                let r = self.add()?;
                return Ok(Expr::Binary(op.into(), Box::new(l), Box::new(r)));
            }
        }
        if self.peek_ident("in") {
            self.pos += 1;
            let r = self.add()?;
            return Ok(Expr::Binary("in".into(), Box::new(l), Box::new(r)));
        }
        Ok(l)
    }
    fn add(&mut self) -> Result<Expr, String> {
        let mut l = self.mul()?;
        while self.peek_op("+") || self.peek_op("-") {
            let Some(Tok::Op(op)) = self.toks.get(self.pos).cloned() else {
                break;
            };
            self.pos += 1;
            let r = self.mul()?;
            l = Expr::Binary(op, Box::new(l), Box::new(r));
        }
        Ok(l)
    }
    fn mul(&mut self) -> Result<Expr, String> {
        let mut l = self.unary()?;
        while self.peek_op("*") || self.peek_op("/") || self.peek_op("%") {
            let Some(Tok::Op(op)) = self.toks.get(self.pos).cloned() else {
                break;
            };
            self.pos += 1;
            let r = self.unary()?;
            l = Expr::Binary(op, Box::new(l), Box::new(r));
        }
        Ok(l)
    }
    fn unary(&mut self) -> Result<Expr, String> {
        if self.peek_op("!") {
            self.pos += 1;
            return Ok(Expr::Unary('!', Box::new(self.unary()?)));
        }
        if self.peek_op("-") {
            self.pos += 1;
            return Ok(Expr::Unary('-', Box::new(self.unary()?)));
        }
        self.postfix()
    }
    fn args(&mut self) -> Result<Vec<Expr>, String> {
        let mut a = Vec::new();
        if self.peek_op(")") {
            self.pos += 1;
            return Ok(a);
        }
        loop {
            a.push(self.expr()?);
            if self.peek_op(",") {
                self.pos += 1;
                continue;
            }
            self.expect(")")?;
            return Ok(a);
        }
    }
    fn postfix(&mut self) -> Result<Expr, String> {
        let mut e = self.primary()?;
        loop {
            if self.peek_op(".") {
                self.pos += 1;
                let Some(Tok::Ident(name)) = self.toks.get(self.pos).cloned() else {
                    return Err("expected field name".into());
                };
                self.pos += 1;
                if self.peek_op("(") {
                    self.pos += 1;
                    if !METHODS.contains(&name.as_str()) {
                        return Err(format!("unsupported function '{name}'"));
                    }
                    let macro_var = if matches!(
                        name.as_str(),
                        "exists" | "all" | "exists_one" | "filter" | "map"
                    ) {
                        match self.toks.get(self.pos) {
                            Some(Tok::Ident(v)) => Some(v.clone()),
                            _ => return Err(format!("{name} needs a variable")),
                        }
                    } else {
                        None
                    };
                    if let Some(v) = &macro_var {
                        self.bound.push(v.clone());
                    }
                    let args = self.args();
                    if macro_var.is_some() {
                        self.bound.pop();
                    }
                    e = Expr::Method(Box::new(e), name, args?);
                } else {
                    e = Expr::Select(Box::new(e), name);
                }
            } else if self.peek_op("[") {
                self.pos += 1;
                let i = self.expr()?;
                self.expect("]")?;
                e = Expr::Index(Box::new(e), Box::new(i));
            } else {
                return Ok(e);
            }
        }
    }
    fn primary(&mut self) -> Result<Expr, String> {
        let Some(t) = self.toks.get(self.pos).cloned() else {
            return Err("unexpected end of expression".into());
        };
        self.pos += 1;
        match t {
            Tok::Str(s) => Ok(Expr::Lit(Value::String(s))),
            Tok::Int(i) => Ok(Expr::Lit(json!(i))),
            Tok::Float(f) => Ok(Expr::Lit(json!(f))),
            Tok::Ident(id) => match id.as_str() {
                "true" => Ok(Expr::Lit(Value::Bool(true))),
                "false" => Ok(Expr::Lit(Value::Bool(false))),
                "null" => Ok(Expr::Lit(Value::Null)),
                _ if self.peek_op("(") => {
                    self.pos += 1;
                    if !FUNCS.contains(&id.as_str()) {
                        return Err(format!("unsupported function '{id}'"));
                    }
                    let args = self.args()?;
                    if id == "has" {
                        let [a] = <[Expr; 1]>::try_from(args)
                            .map_err(|_| "has() takes one argument".to_string())?;
                        if !matches!(a, Expr::Select(..)) {
                            return Err("has() needs a field selection".into());
                        }
                        return Ok(Expr::Has(Box::new(a)));
                    }
                    Ok(Expr::Call(id, args))
                }
                _ => {
                    if !self.allowed_roots.contains(&id.as_str()) && !self.bound.contains(&id) {
                        return Err(format!("undeclared reference to '{id}'"));
                    }
                    Ok(Expr::Ident(id))
                }
            },
            Tok::Op(o) if o == "(" => {
                let e = self.expr()?;
                self.expect(")")?;
                Ok(e)
            }
            Tok::Op(o) if o == "[" => {
                let mut items = Vec::new();
                if self.peek_op("]") {
                    self.pos += 1;
                    return Ok(Expr::List(items));
                }
                loop {
                    items.push(self.expr()?);
                    if self.peek_op(",") {
                        self.pos += 1;
                        continue;
                    }
                    self.expect("]")?;
                    return Ok(Expr::List(items));
                }
            }
            other => Err(format!("unexpected token {other:?}")),
        }
    }
}

/// Parse `src`, allowing only the given root variables.
pub fn parse(src: &str, roots: &[&str]) -> Result<Expr, String> {
    let toks = lex(src)?;
    let mut p = Parser {
        toks: &toks,
        pos: 0,
        allowed_roots: roots,
        bound: Vec::new(),
    };
    let e = p.expr()?;
    if p.pos != toks.len() {
        return Err(format!("unexpected trailing input at token {}", p.pos));
    }
    Ok(e)
}

fn num(v: &Value) -> Option<f64> {
    v.as_f64()
}

fn truthy(v: &Value) -> Result<bool, String> {
    v.as_bool().ok_or_else(|| format!("expected bool, got {v}"))
}

fn values_equal(a: &Value, b: &Value) -> bool {
    match (num(a), num(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// Evaluate with the given variables.
pub fn eval(e: &Expr, env: &HashMap<String, Value>) -> Result<Value, String> {
    match e {
        Expr::Lit(v) => Ok(v.clone()),
        Expr::Ident(id) => env
            .get(id)
            .cloned()
            .ok_or_else(|| format!("no such variable {id}")),
        Expr::Select(t, f) => {
            let v = eval(t, env)?;
            v.get(f).cloned().ok_or_else(|| format!("no such key: {f}"))
        }
        Expr::Index(t, i) => {
            let v = eval(t, env)?;
            let i = eval(i, env)?;
            match (&v, &i) {
                (Value::Array(a), Value::Number(n)) => {
                    let idx = n.as_u64().ok_or("bad index")? as usize;
                    a.get(idx)
                        .cloned()
                        .ok_or_else(|| "index out of range".to_string())
                }
                (Value::Object(m), Value::String(k)) => {
                    m.get(k).cloned().ok_or_else(|| format!("no such key: {k}"))
                }
                _ => Err("invalid index".into()),
            }
        }
        Expr::Has(sel) => {
            let Expr::Select(t, f) = sel.as_ref() else {
                return Err("bad has()".into());
            };
            let v = eval(t, env)?;
            Ok(Value::Bool(
                v.as_object().is_some_and(|m| m.contains_key(f)),
            ))
        }
        Expr::Call(f, args) => {
            let vals: Vec<Value> = args
                .iter()
                .map(|a| eval(a, env))
                .collect::<Result<_, _>>()?;
            match (f.as_str(), vals.as_slice()) {
                ("size", [v]) => size(v),
                ("string", [v]) => Ok(Value::String(match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })),
                ("int", [v]) => match v {
                    Value::String(s) => s
                        .parse::<i64>()
                        .map(|i| json!(i))
                        .map_err(|e| e.to_string()),
                    Value::Number(n) => Ok(json!(n.as_f64().unwrap_or_default() as i64)),
                    _ => Err("int() of unsupported type".into()),
                },
                _ => Err(format!("bad call {f}")),
            }
        }
        Expr::Method(t, m, args) => method(t, m, args, env),
        Expr::Unary(op, x) => {
            let v = eval(x, env)?;
            match op {
                '!' => Ok(Value::Bool(!truthy(&v)?)),
                _ => num(&v)
                    .map(|n| json!(-n))
                    .ok_or_else(|| "negation of non-number".to_string()),
            }
        }
        Expr::Cond(c, a, b) => {
            if truthy(&eval(c, env)?)? {
                eval(a, env)
            } else {
                eval(b, env)
            }
        }
        Expr::List(items) => Ok(Value::Array(
            items
                .iter()
                .map(|i| eval(i, env))
                .collect::<Result<_, _>>()?,
        )),
        Expr::Binary(op, l, r) => {
            if op == "&&" {
                // CEL's commutative error handling, simplified: false wins.
                let lv = eval(l, env).and_then(|v| truthy(&v));
                if lv == Ok(false) {
                    return Ok(Value::Bool(false));
                }
                let rv = truthy(&eval(r, env)?)?;
                return Ok(Value::Bool(lv? && rv));
            }
            if op == "||" {
                let lv = eval(l, env).and_then(|v| truthy(&v));
                if lv == Ok(true) {
                    return Ok(Value::Bool(true));
                }
                let rv = truthy(&eval(r, env)?)?;
                return Ok(Value::Bool(lv? || rv));
            }
            let a = eval(l, env)?;
            let b = eval(r, env)?;
            match op.as_str() {
                "==" => Ok(Value::Bool(values_equal(&a, &b))),
                "!=" => Ok(Value::Bool(!values_equal(&a, &b))),
                "in" => match &b {
                    Value::Array(items) => {
                        Ok(Value::Bool(items.iter().any(|x| values_equal(x, &a))))
                    }
                    Value::Object(m) => {
                        Ok(Value::Bool(a.as_str().is_some_and(|k| m.contains_key(k))))
                    }
                    _ => Err("'in' needs a list or map".into()),
                },
                "<" | "<=" | ">" | ">=" => {
                    let ord = match (&a, &b) {
                        (Value::String(x), Value::String(y)) => x.partial_cmp(y),
                        _ => num(&a).zip(num(&b)).and_then(|(x, y)| x.partial_cmp(&y)),
                    }
                    .ok_or("incomparable values")?;
                    use std::cmp::Ordering::*;
                    Ok(Value::Bool(match op.as_str() {
                        "<" => ord == Less,
                        "<=" => ord != Greater,
                        ">" => ord == Greater,
                        _ => ord != Less,
                    }))
                }
                "+" => match (&a, &b) {
                    (Value::String(x), Value::String(y)) => Ok(Value::String(format!("{x}{y}"))),
                    (Value::Array(x), Value::Array(y)) => {
                        Ok(Value::Array(x.iter().chain(y).cloned().collect()))
                    }
                    _ => arith(&a, &b, |x, y| x + y),
                },
                "-" => arith(&a, &b, |x, y| x - y),
                "*" => arith(&a, &b, |x, y| x * y),
                "/" => {
                    if num(&b) == Some(0.0) {
                        return Err("division by zero".into());
                    }
                    arith(&a, &b, |x, y| x / y)
                }
                "%" => {
                    if num(&b) == Some(0.0) {
                        return Err("modulus by zero".into());
                    }
                    arith(&a, &b, |x, y| x % y)
                }
                _ => Err(format!("unknown operator {op}")),
            }
        }
    }
}

fn arith(a: &Value, b: &Value, f: impl Fn(f64, f64) -> f64) -> Result<Value, String> {
    let (x, y) = num(a).zip(num(b)).ok_or("arithmetic on non-numbers")?;
    let r = f(x, y);
    if a.is_i64() && b.is_i64() && r.fract() == 0.0 {
        Ok(json!(r as i64))
    } else {
        Ok(json!(r))
    }
}

fn size(v: &Value) -> Result<Value, String> {
    Ok(json!(match v {
        Value::String(s) => s.chars().count(),
        Value::Array(a) => a.len(),
        Value::Object(m) => m.len(),
        _ => return Err("size() of unsupported type".into()),
    }))
}

fn method(t: &Expr, m: &str, args: &[Expr], env: &HashMap<String, Value>) -> Result<Value, String> {
    let target = eval(t, env)?;
    if matches!(m, "exists" | "all" | "exists_one" | "filter" | "map") {
        let [Expr::Ident(var), body] = args else {
            return Err(format!("{m} needs (var, expr)"));
        };
        let items: Vec<Value> = match &target {
            Value::Array(a) => a.clone(),
            Value::Object(o) => o.keys().map(|k| Value::String(k.clone())).collect(),
            _ => return Err(format!("{m} on non-list")),
        };
        let mut env2 = env.clone();
        let mut results = Vec::new();
        for it in &items {
            env2.insert(var.clone(), it.clone());
            results.push((it.clone(), eval(body, &env2)?));
        }
        return match m {
            "exists" => Ok(Value::Bool(
                results.iter().any(|(_, r)| r.as_bool() == Some(true)),
            )),
            "all" => Ok(Value::Bool(
                results.iter().all(|(_, r)| r.as_bool() == Some(true)),
            )),
            "exists_one" => Ok(Value::Bool(
                results
                    .iter()
                    .filter(|(_, r)| r.as_bool() == Some(true))
                    .count()
                    == 1,
            )),
            "filter" => Ok(Value::Array(
                results
                    .into_iter()
                    .filter(|(_, r)| r.as_bool() == Some(true))
                    .map(|(i, _)| i)
                    .collect(),
            )),
            _ => Ok(Value::Array(results.into_iter().map(|(_, r)| r).collect())),
        };
    }
    let vals: Vec<Value> = args
        .iter()
        .map(|a| eval(a, env))
        .collect::<Result<_, _>>()?;
    match (m, &target, vals.as_slice()) {
        ("size", v, []) => size(v),
        ("startsWith", Value::String(s), [Value::String(p)]) => {
            Ok(Value::Bool(s.starts_with(p.as_str())))
        }
        ("endsWith", Value::String(s), [Value::String(p)]) => {
            Ok(Value::Bool(s.ends_with(p.as_str())))
        }
        ("contains", Value::String(s), [Value::String(p)]) => {
            Ok(Value::Bool(s.contains(p.as_str())))
        }
        ("matches", Value::String(s), [Value::String(p)]) => {
            let re = regex::Regex::new(p).map_err(|e| e.to_string())?;
            Ok(Value::Bool(re.is_match(s)))
        }
        _ => Err(format!("no matching overload for {m}")),
    }
}

/// Evaluate to a boolean.
pub fn eval_bool(e: &Expr, env: &HashMap<String, Value>) -> Result<bool, String> {
    truthy(&eval(e, env)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn match_conditions() {
        let roots = ["request", "object", "oldObject"];
        let e = parse(r#"request.userInfo.username.startsWith("system:ovn-node:") && !("x" in request.userInfo.groups)"#, &roots)
            .expect("parse");
        let mut env = HashMap::new();
        env.insert(
            "request".into(),
            json!({"userInfo": {"username": "system:ovn-node:n1", "groups": ["a"]}}),
        );
        assert!(eval_bool(&e, &env).expect("eval"));
        assert!(parse("authorizer.group('').check()", &roots).is_err());
        assert!(parse("request.foo(", &roots).is_err());
        let e = parse(
            "has(object.metadata.labels) && object.metadata.labels.exists(k, k.startsWith('a'))",
            &roots,
        )
        .expect("p");
        env.insert(
            "object".into(),
            json!({"metadata": {"labels": {"ab": "1"}}}),
        );
        assert!(eval_bool(&e, &env).expect("eval"));
        let e = parse(
            "size(self.x) <= 3 && self.y == oldSelf.y",
            &["self", "oldSelf"],
        )
        .expect("p");
        let mut env = HashMap::new();
        env.insert("self".into(), json!({"x": "ab", "y": 1}));
        env.insert("oldSelf".into(), json!({"y": 1.0}));
        assert!(eval_bool(&e, &env).expect("eval"));
    }
}
