//! Placeholder: implemented in the algorithms branch.
