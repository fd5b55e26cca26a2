//! Benchmark patterns (placeholder).
