//! The sizes the inference computes with: polynomials with integer coefficients over symbols, the
//! graph inputs' dim names (`batch`, `seq`) or an expression the inference cannot take apart
//! (`Max(1,seq)`, `(seq-1)//2+1`), kept whole as one symbol. A dim written `Dim::Sym` is parsed into
//! one ([`Poly::parse`]: sums, differences and products of integers, names and parentheses) and a
//! computed one is written back in one canonical form ([`Poly::to_dim`]: `2*seq+1`, `batch*seq`), so
//! two spellings of one size compare equal and the file names each size by the inputs' dims.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::graph::Dim;

/// A product of symbols, sorted, a symbol repeated for a power.
type Monomial = Vec<String>;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Poly {
    /// monomial -> coefficient, none zero; the constant term under the empty monomial
    terms: BTreeMap<Monomial, i64>,
}

impl Poly {
    pub(crate) fn constant(c: i64) -> Poly {
        let mut terms = BTreeMap::new();
        if c != 0 {
            terms.insert(Vec::new(), c);
        }
        Poly { terms }
    }

    pub(crate) fn symbol(s: &str) -> Poly {
        let mut terms = BTreeMap::new();
        terms.insert(vec![s.to_owned()], 1);
        Poly { terms }
    }

    /// The integer, when the polynomial is one.
    pub(crate) fn as_const(&self) -> Option<i64> {
        match self.terms.len() {
            0 => Some(0),
            1 => self.terms.get(&Vec::new()).copied(),
            _ => None,
        }
    }

    /// A builder dim as a polynomial (None: unknown).
    pub(crate) fn from_dim(d: &Dim) -> Option<Poly> {
        match d {
            Dim::Fixed(v) => Some(Poly::constant(*v)),
            Dim::Sym(s) => Some(Poly::parse(s)),
            Dim::Unknown => None,
        }
    }

    /// The polynomial as a builder dim: an integer as `Fixed`, the rest in canonical form.
    pub(crate) fn to_dim(&self) -> Dim {
        match self.as_const() {
            Some(c) => Dim::Fixed(c),
            None => Dim::Sym(self.to_string()),
        }
    }

    /// `text` parsed (sums, differences, products of integers, names and parenthesised
    /// sub-expressions); anything else is one symbol, the whole text.
    pub(crate) fn parse(text: &str) -> Poly {
        let tokens = tokenize(text);
        let mut p = Parser {
            tokens: &tokens,
            at: 0,
        };
        match tokens.as_ref().and_then(|_| p.expr()) {
            Some(poly) if p.at == tokens.as_ref().map_or(0, Vec::len) => poly,
            _ => Poly::symbol(text),
        }
    }

    pub(crate) fn add(&self, other: &Poly) -> Poly {
        let mut terms = self.terms.clone();
        for (m, c) in &other.terms {
            let e = terms.entry(m.clone()).or_insert(0);
            *e = e.saturating_add(*c);
            if *e == 0 {
                terms.remove(m);
            }
        }
        Poly { terms }
    }

    pub(crate) fn scale(&self, k: i64) -> Poly {
        if k == 0 {
            return Poly::default();
        }
        Poly {
            terms: self
                .terms
                .iter()
                .map(|(m, c)| (m.clone(), c.saturating_mul(k)))
                .collect(),
        }
    }

    pub(crate) fn sub(&self, other: &Poly) -> Poly {
        self.add(&other.scale(-1))
    }

    pub(crate) fn mul(&self, other: &Poly) -> Poly {
        let mut out = Poly::default();
        for (ma, ca) in &self.terms {
            for (mb, cb) in &other.terms {
                let mut m = ma.clone();
                m.extend(mb.iter().cloned());
                m.sort_unstable();
                let mut terms = BTreeMap::new();
                terms.insert(m, ca.saturating_mul(*cb));
                out = out.add(&Poly { terms });
            }
        }
        out
    }

    /// `self / other` when it is exact as polynomials: every term of `self` divided by the one term
    /// of `other` (a constant or a product of symbols times a constant), or `self` a constant
    /// multiple of `other`.
    pub(crate) fn div_exact(&self, other: &Poly) -> Option<Poly> {
        if other.terms.is_empty() {
            return None;
        }
        if self == other {
            return Some(Poly::constant(1));
        }
        if other.terms.len() == 1 {
            let (dm, dc) = other.terms.iter().next()?;
            let mut out = BTreeMap::new();
            for (m, c) in &self.terms {
                if c.checked_rem(*dc)? != 0 {
                    return None;
                }
                let mut rest = m.clone();
                for s in dm {
                    let at = rest.iter().position(|r| r == s)?;
                    rest.remove(at);
                }
                out.insert(rest, c.checked_div(*dc)?);
            }
            return Some(Poly { terms: out });
        }
        // a constant multiple: the ratio of the first terms, checked on all
        let (m0, c0) = other.terms.iter().next()?;
        let k = self.terms.get(m0)?;
        if k.checked_rem(*c0)? != 0 {
            return None;
        }
        let q = Poly::constant(k.checked_div(*c0)?);
        (other.mul(&q) == *self).then_some(q)
    }

    /// `floor(self / d)` for a positive `d`: exact when it divides, else the expression as one
    /// symbol (Python's floor division, which the sizes are: non-negative).
    pub(crate) fn floor_div(&self, d: i64) -> Option<Poly> {
        if d <= 0 {
            return None;
        }
        if let Some(c) = self.as_const() {
            return Some(Poly::constant(c.div_euclid(d)));
        }
        if d == 1 {
            return Some(self.clone());
        }
        if let Some(q) = self.div_exact(&Poly::constant(d)) {
            return Some(q);
        }
        Some(Poly::symbol(&format!("({self})//{d}")))
    }

    /// `ceil(self / d)` for a positive `d`.
    pub(crate) fn ceil_div(&self, d: i64) -> Option<Poly> {
        self.add(&Poly::constant(d.checked_sub(1)?)).floor_div(d)
    }

    /// The larger of two sizes where it is decided (equal, or both integers).
    pub(crate) fn max(&self, other: &Poly) -> Option<Poly> {
        if self == other {
            return Some(self.clone());
        }
        Some(Poly::constant(self.as_const()?.max(other.as_const()?)))
    }
}

/// A symbol as a factor of a product: an expression kept whole is parenthesised, unless it is a
/// name, parenthesised already or one call (`Max(1,seq)`).
fn factor(s: &str) -> String {
    let name_end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    let rest = &s[name_end..];
    if rest.is_empty() || (rest.starts_with('(') && closes_at_end(rest)) {
        s.to_owned()
    } else {
        format!("({s})")
    }
}

/// Whether the parenthesis opening `s` closes at its last character.
fn closes_at_end(s: &str) -> bool {
    let mut depth = 0i32;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1 == s.len();
                }
            }
            _ => {}
        }
    }
    false
}

impl std::fmt::Display for Poly {
    /// Highest degree first, then by name; the constant last: `2*seq+1`, `batch*seq-seq`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.terms.is_empty() {
            return f.write_str("0");
        }
        let mut order: Vec<(&Monomial, &i64)> = self.terms.iter().collect();
        order.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(b.0)));
        let mut out = String::new();
        for (i, (m, &c)) in order.into_iter().enumerate() {
            let (sign, abs) = if c < 0 {
                ("-", c.unsigned_abs())
            } else {
                ("+", c.unsigned_abs())
            };
            if i > 0 || sign == "-" {
                out.push_str(sign);
            }
            let factors: Vec<String> = m.iter().map(|s| factor(s)).collect();
            if m.is_empty() {
                let _ = write!(out, "{abs}");
            } else if abs == 1 {
                out.push_str(&factors.join("*"));
            } else {
                let _ = write!(out, "{abs}*{}", factors.join("*"));
            }
        }
        f.write_str(&out)
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Int(i64),
    Name(String),
    Op(char),
}

/// None when the text holds anything but integers, names, `+ - * ( )` and spaces.
fn tokenize(text: &str) -> Option<Vec<Tok>> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            let s: String = chars[start..i].iter().collect();
            out.push(Tok::Int(s.parse().ok()?));
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Tok::Name(chars[start..i].iter().collect()));
        } else if "+-*()".contains(c) {
            // `**` and `//` are not ours
            if (c == '*' || c == '/') && chars.get(i + 1) == Some(&c) {
                return None;
            }
            out.push(Tok::Op(c));
            i += 1;
        } else {
            return None;
        }
    }
    Some(out)
}

struct Parser<'a> {
    tokens: &'a Option<Vec<Tok>>,
    at: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.tokens.as_ref()?.get(self.at)
    }

    fn expr(&mut self) -> Option<Poly> {
        let mut acc = self.term()?;
        while let Some(Tok::Op(op @ ('+' | '-'))) = self.peek().cloned() {
            self.at += 1;
            let t = self.term()?;
            acc = if op == '+' { acc.add(&t) } else { acc.sub(&t) };
        }
        Some(acc)
    }

    fn term(&mut self) -> Option<Poly> {
        let mut acc = self.factor()?;
        while let Some(Tok::Op('*')) = self.peek() {
            self.at += 1;
            acc = acc.mul(&self.factor()?);
        }
        Some(acc)
    }

    fn factor(&mut self) -> Option<Poly> {
        let t = self.peek()?.clone();
        self.at += 1;
        match t {
            Tok::Int(v) => Some(Poly::constant(v)),
            Tok::Name(n) => Some(Poly::symbol(&n)),
            Tok::Op('-') => Some(self.factor()?.scale(-1)),
            Tok::Op('(') => {
                let e = self.expr()?;
                match self.peek() {
                    Some(Tok::Op(')')) => {
                        self.at += 1;
                        Some(e)
                    }
                    _ => None,
                }
            }
            Tok::Op(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Poly;
    use crate::graph::Dim;

    #[test]
    fn spellings_of_one_size_are_equal_and_written_one_way() {
        let a = Poly::parse("2*seq + 1");
        let b = Poly::parse("1+seq*2");
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "2*seq+1");
        assert_eq!(Poly::parse("seq*batch").to_string(), "batch*seq");
        assert_eq!(Poly::parse("-(seq - 32)").to_string(), "-seq+32");
        assert_eq!(Poly::parse("seq-seq+3").to_dim(), Dim::Fixed(3));
    }

    #[test]
    fn what_it_cannot_take_apart_is_one_symbol() {
        let m = Poly::parse("Max(1,seq)");
        assert_eq!(m.to_string(), "Max(1,seq)");
        let twice = m.scale(2).add(&Poly::constant(1));
        assert_eq!(twice.to_string(), "2*Max(1,seq)+1");
        assert_eq!(Poly::parse("(seq//2)").to_string(), "(seq//2)");
        assert_eq!(
            Poly::parse("seq//2").mul(&Poly::symbol("b")).to_string(),
            "b*(seq//2)"
        );
    }

    #[test]
    fn division() {
        let bs = Poly::parse("batch*seq*32");
        let b32 = Poly::parse("32*batch");
        assert_eq!(bs.div_exact(&b32), Some(Poly::symbol("seq")));
        assert_eq!(
            Poly::parse("2*seq+2").div_exact(&Poly::parse("seq+1")),
            Some(Poly::constant(2))
        );
        assert_eq!(Poly::parse("seq+1").div_exact(&Poly::constant(2)), None);
        assert_eq!(
            Poly::parse("seq+1").floor_div(2).map(|p| p.to_string()),
            Some("((seq+1)//2)".into())
        );
        assert_eq!(Poly::constant(7).ceil_div(2), Some(Poly::constant(4)));
    }
}
