//! What is checked on the YAML document itself, in one linear pass over the parser's events
//! before it is deserialized, each error at the node that makes it:
//!
//! - **A bound on what aliases expand to.** serde_yaml refuses exponential "billion laughs"
//!   documents, but one anchor aliased n times still costs n² nodes: 20 KB of YAML took 20 s
//!   and 600 MB. A config is edited by people and reloaded on every save, so a document whose
//!   aliases would add more than [`MAX_ALIAS_NODES`] nodes is an error at the alias that
//!   crosses the bound.
//! - **Unique mapping keys** (YAML 1.2 §3.2.1.1). serde_yaml keeps the last of two equal keys
//!   where it builds a map (a second `api:` upstream replaced the first) and reports a
//!   repeated struct field at the file's 1:1; here the second key is the error, at its line.
//! - **A bound on nesting** ([`MAX_DEPTH`]). A config is a few levels deep; libyaml (under
//!   serde_yaml) takes time quadratic in the depth (80 000 levels, 160 KB: 19 s), and would
//!   refuse past 128 levels only after that.
//!
//! The pass stops at the first error, which is the one reported.

use std::collections::{HashMap, HashSet};

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

/// Nodes that aliases may add to a document: generous for sharing limit lists between
/// routes, far below what costs noticeable time.
pub const MAX_ALIAS_NODES: u64 = 100_000;

/// Collections open inside each other at most: a config needs under ten.
pub const MAX_DEPTH: usize = 64;

/// `Err((line, col, message))` at the first node in error, in document order.
pub fn check(text: &str) -> Result<(), (usize, usize, String)> {
    let mut c = Checker::default();
    let mut parser = Parser::new_from_str(text);
    while c.error.is_none() {
        match parser.next_token() {
            Ok((Event::StreamEnd, _)) => break,
            Ok((ev, mark)) => c.on_event(ev, mark),
            // The scanner reads ahead, and refuses 256 nested flow collections itself,
            // sooner than they reach this pass as events.
            Err(e) if e.info() == "recursion limit exceeded" => {
                c.fail(
                    *e.marker(),
                    format!("nested deeper than {MAX_DEPTH} levels"),
                );
            }
            // Syntax errors are reported by serde_yaml, with its own positions.
            Err(_) => break,
        }
    }
    c.error.map_or(Ok(()), Err)
}

#[derive(Default)]
struct Checker {
    /// Per open collection: its anchor id (0 = none), its node count so far, expanded, and
    /// for a mapping the keys seen so far.
    stack: Vec<Open>,
    /// Expanded node count of each anchor seen so far.
    sizes: HashMap<usize, u64>,
    /// Nodes added by aliases.
    added: u64,
    error: Option<(usize, usize, String)>,
}

struct Open {
    anchor: usize,
    nodes: u64,
    /// `Some` for a mapping: its scalar keys so far and whether the next node is a key.
    keys: Option<(HashSet<String>, bool)>,
}

impl Checker {
    fn add(&mut self, n: u64) {
        if let Some(top) = self.stack.last_mut() {
            top.nodes = top.nodes.saturating_add(n);
        }
    }

    fn fail(&mut self, mark: Marker, message: String) {
        if self.error.is_none() {
            self.error = Some((mark.line(), mark.col() + 1, message));
        }
    }

    /// A node starts in the innermost open collection; if that is a mapping, the node is a
    /// key or a value in turn. `scalar`: the node's text, when it is a scalar.
    fn node(&mut self, scalar: Option<&str>, mark: Marker) {
        let Some((seen, is_key)) = self.stack.last_mut().and_then(|o| o.keys.as_mut()) else {
            return;
        };
        let key = std::mem::replace(is_key, !*is_key);
        if let (true, Some(k)) = (key, scalar) {
            if !seen.insert(k.to_owned()) {
                self.fail(mark, format!("duplicate key `{k}`"));
            }
        }
    }
}

impl MarkedEventReceiver for Checker {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        match ev {
            Event::Scalar(text, _, anchor, _) => {
                self.node(Some(&text), mark);
                if anchor > 0 {
                    self.sizes.insert(anchor, 1);
                }
                self.add(1);
            }
            Event::Alias(id) => {
                self.node(None, mark);
                let n = self.sizes.get(&id).copied().unwrap_or(1);
                self.added = self.added.saturating_add(n);
                self.add(n);
                if self.added > MAX_ALIAS_NODES {
                    self.fail(
                        mark,
                        format!(
                            "aliases expand this document by more than {MAX_ALIAS_NODES} nodes"
                        ),
                    );
                }
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                self.node(None, mark);
                if self.stack.len() >= MAX_DEPTH {
                    self.fail(mark, format!("nested deeper than {MAX_DEPTH} levels"));
                }
                let keys = matches!(ev, Event::MappingStart(..)).then(|| (HashSet::new(), true));
                self.stack.push(Open {
                    anchor,
                    nodes: 1,
                    keys,
                });
            }
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some(o) = self.stack.pop() {
                    if o.anchor > 0 {
                        self.sizes.insert(o.anchor, o.nodes);
                    }
                    self.add(o.nodes);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_lists_pass_and_quadratic_expansion_is_refused() {
        let shared = "a: &l [1, 2, 3]\nb: *l\nc: *l\n";
        assert_eq!(check(shared), Ok(()));
        let n = 2400;
        let quadratic = format!(
            "x: [&a [{}], {}]\n",
            vec!["ip"; n].join(", "),
            vec!["*a"; n].join(", ")
        );
        let (line, col, msg) = check(&quadratic).unwrap_err();
        assert_eq!(line, 1);
        assert!(col > 1, "{col}");
        assert!(msg.contains("100000"), "{msg}");
        // Exponential nesting saturates instead of overflowing.
        let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..40 {
            let p = i - 1;
            bomb.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        assert!(check(&bomb).is_err());
    }

    #[test]
    fn nesting_is_bounded_at_the_collection_that_crosses_it() {
        let fits = format!(
            "x: {}{}\n",
            "[".repeat(MAX_DEPTH - 1),
            "]".repeat(MAX_DEPTH - 1)
        );
        assert_eq!(check(&fits), Ok(()));
        let deep = format!("x: {}{}\n", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        let (line, col, msg) = check(&deep).unwrap_err();
        // The document's mapping is the first level; its value's 64th list crosses.
        assert_eq!((line, col), (1, 3 + MAX_DEPTH));
        assert!(msg.contains("deeper than 64"), "{msg}");
        // Far deeper, the pass stops there rather than reading on.
        let n = 200_000;
        let huge = format!("x: {}{}\n", "[".repeat(n), "]".repeat(n));
        assert!(check(&huge).is_err());
    }

    #[test]
    fn a_repeated_key_is_an_error_at_its_second_occurrence() {
        // Quoted or plain, the same key; nested mappings and mappings in lists each have
        // their own keys; a value equal to a key is no repeat.
        let (line, col, msg) =
            check("a: 1\nb:\n  c: c\n  d: [{x: 1}, {x: 2}]\n\"a\": 2\n").unwrap_err();
        assert_eq!((line, col, msg.as_str()), (5, 1, "duplicate key `a`"));
        let (line, col, _) = check("r:\n  - name: x\n    name: y\n").unwrap_err();
        assert_eq!((line, col), (3, 5));
        // A key after a nested mapping value is still a key.
        let (line, col, _) = check("u:\n  api: {t: 1}\n  api: {t: 2}\n").unwrap_err();
        assert_eq!((line, col), (3, 3));
        assert_eq!(check("a: {b: 1, c: b}\nb: [a, a]\nc: {a: 1}\n"), Ok(()));
        // Only the first error is kept.
        let (line, ..) = check("a: 1\na: 2\na: 3\n").unwrap_err();
        assert_eq!(line, 2);
    }
}
