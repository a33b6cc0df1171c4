//! Where each field of the YAML file sits, so semantic errors can say `FILE:LINE:COL`.
//!
//! serde_yaml reports positions for structural errors only; this walks the same text with
//! yaml-rust2's marked event parser and records, for every mapping key and sequence item,
//! its dotted path (`routes[0].limits[1].burst`) and 1-based line and column.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pos {
    pub line: usize,
    pub col: usize,
}

#[derive(Debug, Default)]
pub struct Positions {
    map: HashMap<String, Pos>,
}

impl Positions {
    pub fn index(text: &str) -> Positions {
        let mut b = Builder::default();
        // A syntax error here is reported by serde_yaml with its own position.
        let _ = Parser::new_from_str(text).load(&mut b, false);
        Positions { map: b.map }
    }

    /// Position of `path`, or of its nearest recorded ancestor (never fails: 1:1 at worst).
    pub fn of(&self, path: &str) -> Pos {
        let mut p = path;
        loop {
            if let Some(pos) = self.map.get(p) {
                return *pos;
            }
            match p.rfind(['.', '[']) {
                Some(i) => p = &p[..i],
                None => return Pos { line: 1, col: 1 },
            }
        }
    }
}

enum Frame {
    Map {
        path: String,
        key: Option<String>,
        first: bool,
    },
    Seq {
        path: String,
        next: usize,
    },
}

#[derive(Default)]
struct Builder {
    stack: Vec<Frame>,
    map: HashMap<String, Pos>,
}

fn pos(m: Marker) -> Pos {
    Pos {
        line: m.line(),
        col: m.col() + 1,
    }
}

impl Builder {
    /// Path of the node that starts now (a value), recording sequence item positions.
    fn value_path(&mut self, mark: Marker) -> Option<String> {
        match self.stack.last_mut() {
            None => Some(String::new()),
            Some(Frame::Map { key, .. }) => key.take(),
            Some(Frame::Seq { path, next }) => {
                let p = format!("{path}[{next}]");
                *next += 1;
                self.map.insert(p.clone(), pos(mark));
                Some(p)
            }
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        match ev {
            Event::Scalar(value, ..) => {
                if let Some(Frame::Map {
                    path,
                    key: key @ None,
                    first,
                }) = self.stack.last_mut()
                {
                    let p = if path.is_empty() {
                        value
                    } else {
                        format!("{path}.{value}")
                    };
                    // A list item that is a block mapping is reported after its first key;
                    // that key's own position is where a person sees the item begin.
                    if std::mem::take(first) && path.ends_with(']') {
                        self.map.insert(path.clone(), pos(mark));
                    }
                    self.map.insert(p.clone(), pos(mark));
                    *key = Some(p);
                } else {
                    self.value_path(mark);
                }
            }
            Event::Alias(_) => {
                self.value_path(mark);
            }
            Event::MappingStart(..) => {
                let path = self.value_path(mark).unwrap_or_default();
                self.stack.push(Frame::Map {
                    path,
                    key: None,
                    first: true,
                });
            }
            Event::SequenceStart(..) => {
                let path = self.value_path(mark).unwrap_or_default();
                self.stack.push(Frame::Seq { path, next: 0 });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                self.stack.pop();
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_keys_and_items() {
        let text = "a: 1\nroutes:\n  - name: x\n    limits:\n      - name: l\n        burst: 3\n";
        let p = Positions::index(text);
        assert_eq!(p.of("a"), Pos { line: 1, col: 1 });
        assert_eq!(p.of("routes[0]"), Pos { line: 3, col: 5 });
        assert_eq!(p.of("routes[0].limits[0].burst"), Pos { line: 6, col: 9 });
        // Unknown paths fall back to the nearest ancestor.
        assert_eq!(p.of("routes[0].limits[0].cost"), Pos { line: 5, col: 9 });
        assert_eq!(p.of("nothing"), Pos { line: 1, col: 1 });
    }

    #[test]
    fn flow_mappings_are_indexed() {
        let p = Positions::index("m: { path_prefix: /, host: x }\n");
        assert_eq!(p.of("m.host"), Pos { line: 1, col: 22 });
    }
}
