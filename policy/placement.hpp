// Where a chunk's directory entry lives in a peer group: rendezvous (highest-random-weight)
// hashing of the chunk over the live members. Every member computes the same home from the same
// member list without talking; when a member leaves, only its chunks move, each to the member with
// the next-highest weight; when one joins, it takes about 1/N of every other member's chunks.
// Pure functions, no I/O.
#pragma once

#include <string>
#include <vector>

#include "core/hash.hpp"

namespace cairn {

// The weight of (chunk, member): a 64-bit mix of the chunk hash and the member id.
uint64_t placement_weight(const ChunkHash& chunk, const std::string& member);
// The member with the highest weight ("" when members is empty). Ties (astronomically rare) go to
// the smaller id.
std::string home_of(const ChunkHash& chunk, const std::vector<std::string>& members);

}  // namespace cairn
