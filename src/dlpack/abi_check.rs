//! placeholder until the ABI check lands
