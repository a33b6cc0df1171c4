//! Deciding limits: the six algorithms (`algo`, each with its Lua twin in `lua/`), the one key
//! builder requests and the admin API share (`key`), and the stores that hold the state
//! (`store`: embedded memory, or Redis with its scripts and breaker). Depends only on `model`.

pub mod algo;
pub mod deny;
pub mod key;
pub mod keyed;
pub mod store;
