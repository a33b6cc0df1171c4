//! A bound on what YAML aliases can expand to, checked before the document is deserialized.
//!
//! serde_yaml refuses exponential "billion laughs" documents, but one anchor aliased n times
//! still costs n² nodes: 20 KB of YAML took 20 s and 600 MB. A config is edited by people and
//! reloaded on every save, so the expansion is counted first, in one linear pass over the
//! parser's events, and a document whose aliases would add more than [`MAX_ALIAS_NODES`] nodes
//! is an error at the alias that crosses the bound.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

/// Nodes that aliases may add to a document: generous for sharing limit lists between
/// routes, far below what costs noticeable time.
pub const MAX_ALIAS_NODES: u64 = 100_000;

/// `Err((line, col, message))` at the first alias past the bound.
pub fn check(text: &str) -> Result<(), (usize, usize, String)> {
    let mut c = Counter::default();
    // Syntax errors are reported by serde_yaml, with its own positions.
    let _ = Parser::new_from_str(text).load(&mut c, true);
    c.over.map_or(Ok(()), Err)
}

#[derive(Default)]
struct Counter {
    /// Per open collection: its anchor id (0 = none) and its node count so far, expanded.
    stack: Vec<(usize, u64)>,
    /// Expanded node count of each anchor seen so far.
    sizes: HashMap<usize, u64>,
    /// Nodes added by aliases.
    added: u64,
    over: Option<(usize, usize, String)>,
}

impl Counter {
    fn add(&mut self, n: u64) {
        if let Some(top) = self.stack.last_mut() {
            top.1 = top.1.saturating_add(n);
        }
    }
}

impl MarkedEventReceiver for Counter {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        match ev {
            Event::Scalar(_, _, anchor, _) => {
                if anchor > 0 {
                    self.sizes.insert(anchor, 1);
                }
                self.add(1);
            }
            Event::Alias(id) => {
                let n = self.sizes.get(&id).copied().unwrap_or(1);
                self.added = self.added.saturating_add(n);
                self.add(n);
                if self.added > MAX_ALIAS_NODES && self.over.is_none() {
                    self.over = Some((
                        mark.line(),
                        mark.col() + 1,
                        format!(
                            "aliases expand this document by more than {MAX_ALIAS_NODES} nodes"
                        ),
                    ));
                }
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                self.stack.push((anchor, 1));
            }
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some((anchor, n)) = self.stack.pop() {
                    if anchor > 0 {
                        self.sizes.insert(anchor, n);
                    }
                    self.add(n);
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
}
