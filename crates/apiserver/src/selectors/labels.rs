//! Label selectors, read as kube-apiserver reads them (apimachinery's `labels.Parse`): a
//! lexer of identifiers, keywords (`in`, `notin`) and operator symbols, then requirements
//! separated by commas, with its messages (`unable to parse requirement: found '=', expected:
//! identifier`).

use std::collections::BTreeMap;

use serde_json::Value;

/// One label requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
    /// `key>n`: the label is an integer greater than n.
    Greater(String, i64),
    /// `key<n`.
    Less(String, i64),
}

/// A parsed label selector.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<LabelReq>);

/// A lexer token.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Word(String),
    In,
    NotIn,
    Bang,
    Equals,
    DoubleEquals,
    NotEquals,
    Greater,
    Less,
    Open,
    Close,
    Comma,
    End,
}

impl Token {
    /// How kube-apiserver's messages show the token found.
    fn shown(&self) -> String {
        match self {
            Token::Word(word) => word.clone(),
            Token::In => "in".into(),
            Token::NotIn => "notin".into(),
            Token::Bang => "!".into(),
            Token::Equals => "=".into(),
            Token::DoubleEquals => "==".into(),
            Token::NotEquals => "!=".into(),
            Token::Greater => ">".into(),
            Token::Less => "<".into(),
            Token::Open => "(".into(),
            Token::Close => ")".into(),
            Token::Comma => ",".into(),
            Token::End => String::new(),
        }
    }
}

/// The token a symbol alone is (`=`, `!`, `(`, `)`, `,`, `>`, `<`); None for a word's character.
fn symbol(c: char) -> Option<Token> {
    Some(match c {
        '!' => Token::Bang,
        '=' => Token::Equals,
        '>' => Token::Greater,
        '<' => Token::Less,
        '(' => Token::Open,
        ')' => Token::Close,
        ',' => Token::Comma,
        _ => return None,
    })
}

/// Splits a selector into tokens. Symbols are read as the longest operator they begin (`===`
/// is `==` then `=`, `!!` two `!`); words run to a space or a symbol, and `in`/`notin` are keywords (read
/// back as words where a value is expected).
fn tokens(text: &str) -> Vec<Token> {
    let mut out = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start();
        let Some(first) = rest.chars().next() else {
            out.push(Token::End);
            return out;
        };
        if let Some(single) = symbol(first) {
            let (token, used) = match rest.get(..2) {
                Some("==") => (Token::DoubleEquals, 2),
                Some("!=") => (Token::NotEquals, 2),
                _ => (single, 1),
            };
            out.push(token);
            rest = &rest[used..];
        } else {
            let end = rest
                .find(|c: char| c.is_whitespace() || symbol(c).is_some())
                .unwrap_or(rest.len());
            out.push(match &rest[..end] {
                "in" => Token::In,
                "notin" => Token::NotIn,
                word => Token::Word(word.to_string()),
            });
            rest = &rest[end..];
        }
    }
}

/// Reads tokens; where a value is expected the keywords are words.
struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> &Token {
        self.tokens.get(self.at).unwrap_or(&Token::End)
    }

    fn next(&mut self) -> Token {
        let token = self.peek().clone();
        self.at = (self.at + 1).min(self.tokens.len());
        token
    }

    /// The next token with the keywords read as words (a value named `in` is a value).
    fn next_value(&mut self) -> Token {
        match self.next() {
            Token::In => Token::Word("in".into()),
            Token::NotIn => Token::Word("notin".into()),
            other => other,
        }
    }

    fn peek_value(&self) -> Token {
        match self.peek() {
            Token::In => Token::Word("in".into()),
            Token::NotIn => Token::Word("notin".into()),
            other => other.clone(),
        }
    }

    fn requirement(&mut self) -> Result<LabelReq, String> {
        let negated = self.peek_value() == Token::Bang;
        if negated {
            self.next();
        }
        let key = match self.next_value() {
            Token::Word(key) => key,
            other => return Err(format!("found '{}', expected: identifier", other.shown())),
        };
        // kube-apiserver's key error has no field path: it prints as `<nil>`.
        if let Some(why) = crate::meta_rules::qualified_name_error(&key) {
            return Err(format!("<nil>: Invalid value: {key:?}: {why}"));
        }
        // `!key` takes no operator: what follows it is the selector's next part.
        if negated {
            return Ok(LabelReq::NotExists(key));
        }
        if matches!(self.peek_value(), Token::End | Token::Comma) {
            return Ok(LabelReq::Exists(key));
        }
        let operator = self.next();
        let requirement = match operator {
            Token::In | Token::NotIn => {
                let values = self.set()?;
                check_values(&key, &values)?;
                if operator == Token::In {
                    LabelReq::In(key, values)
                } else {
                    LabelReq::NotIn(key, values)
                }
            }
            Token::Equals | Token::DoubleEquals | Token::NotEquals => {
                let value = self.exact_value()?;
                check_values(&key, std::slice::from_ref(&value))?;
                if operator == Token::NotEquals {
                    LabelReq::NotEq(key, value)
                } else {
                    LabelReq::Eq(key, value)
                }
            }
            Token::Greater | Token::Less => {
                let value = self.exact_value()?;
                let Ok(number) = value.parse::<i64>() else {
                    return Err(format!(
                        "values[0]: Invalid value: {value:?}: for 'Gt', 'Lt' operators, the value must be an integer"
                    ));
                };
                check_values(&key, std::slice::from_ref(&value))?;
                if operator == Token::Greater {
                    LabelReq::Greater(key, number)
                } else {
                    LabelReq::Less(key, number)
                }
            }
            other => {
                return Err(format!(
                    "found '{}', expected: in, notin, =, ==, !=, gt, lt",
                    other.shown()
                ));
            }
        };
        Ok(requirement)
    }

    /// The value after `=`, `==`, `!=`, `>` or `<`: a word, or none (the empty value).
    fn exact_value(&mut self) -> Result<String, String> {
        match self.peek_value() {
            Token::End | Token::Comma => Ok(String::new()),
            _ => match self.next_value() {
                Token::Word(value) => Ok(value),
                other => Err(format!("found '{}', expected: identifier", other.shown())),
            },
        }
    }

    /// `(a, b)`; an empty place in the list is the empty value.
    fn set(&mut self) -> Result<Vec<String>, String> {
        match self.next_value() {
            Token::Open => {}
            other => return Err(format!("found '{}' expected: '('", other.shown())),
        }
        let mut values = Vec::new();
        let mut wants_value = true;
        // Right after `(` kube-apiserver's message also offers `)`.
        let mut after_comma = false;
        loop {
            match self.next_value() {
                Token::Word(value) if wants_value => {
                    values.push(value);
                    wants_value = false;
                }
                Token::Comma => {
                    if wants_value {
                        values.push(String::new());
                    }
                    wants_value = true;
                    after_comma = true;
                }
                Token::Close => {
                    if wants_value {
                        values.push(String::new());
                    }
                    values.sort();
                    values.dedup();
                    return Ok(values);
                }
                other if wants_value && values.is_empty() && !after_comma => {
                    return Err(format!(
                        "found '{}', expected: ',', ')' or identifier",
                        other.shown()
                    ));
                }
                other if wants_value => {
                    return Err(format!(
                        "found '{}', expected: ',', or identifier",
                        other.shown()
                    ));
                }
                other => return Err(format!("found '{}', expected: ',' or ')'", other.shown())),
            }
        }
    }
}

/// A requirement's values must be label values.
fn check_values(key: &str, values: &[String]) -> Result<(), String> {
    for (i, value) in values.iter().enumerate() {
        if let Some(why) = crate::meta_rules::label_value_error(value) {
            return Err(format!(
                "values[{i}][{key}]: Invalid value: {value:?}: {why}"
            ));
        }
    }
    Ok(())
}

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (x,y),f notin (z),g,!h,n>3`, with kube-apiserver's messages for
    /// what does not parse.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut parser = Parser {
            tokens: tokens(text),
            at: 0,
        };
        let mut requirements = Vec::new();
        loop {
            match parser.peek_value() {
                Token::End => return Ok(LabelSelector(requirements)),
                Token::Word(_) | Token::Bang => {}
                other => {
                    return Err(format!(
                        "found '{}', expected: !, identifier, or 'end of string'",
                        other.shown()
                    ));
                }
            }
            let requirement = parser
                .requirement()
                .map_err(|why| format!("unable to parse requirement: {why}"))?;
            requirements.push(requirement);
            match parser.next_value() {
                Token::End => return Ok(LabelSelector(requirements)),
                Token::Comma => match parser.peek_value() {
                    Token::Word(_) | Token::Bang => {}
                    other => {
                        return Err(format!(
                            "found '{}', expected: identifier after ','",
                            other.shown()
                        ));
                    }
                },
                other => {
                    return Err(format!(
                        "found '{}', expected: ',' or 'end of string'",
                        other.shown()
                    ));
                }
            }
        }
    }

    /// Whether labels satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let number = |k: &String| labels.get(k).and_then(|v| v.parse::<i64>().ok());
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => labels.get(k) == Some(v),
            LabelReq::NotEq(k, v) => labels.get(k) != Some(v),
            LabelReq::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            LabelReq::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            LabelReq::Exists(k) => labels.contains_key(k),
            LabelReq::NotExists(k) => !labels.contains_key(k),
            LabelReq::Greater(k, n) => number(k).is_some_and(|v| v > *n),
            LabelReq::Less(k, n) => number(k).is_some_and(|v| v < *n),
        })
    }

    /// Whether an object's labels satisfy the selector.
    pub fn matches_object(&self, object: &Value) -> bool {
        if self.0.is_empty() {
            return true;
        }
        let labels: BTreeMap<String, String> = object["metadata"]["labels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        self.matches(&labels)
    }
}
