// What --resume may change in a config: Note [What a resume may change].
#pragma once

#include <string>
#include <vector>

#include "lockstep/config.hpp"
#include "lockstep/trainer.hpp"

namespace lockstep::detail {

// The keys whose values differ between the checkpoint's config and this one, in schema order;
// a key only one side has (a key added to the schema since) is shown as "(absent)" there.
std::vector<ConfigChange> config_changes(const ConfigValues& checkpoint, const ConfigValues& now);

// Whether a resumed run may take a new value for `key` ("optimizer.lr", "trainer.steps").
bool resume_may_change(const std::string& key);

// The changes a resume from `checkpoint_file` accepts; throws InputError naming every changed
// key, both values, and which of them a resume refuses, when any is refused. `hashes_differ`
// with no change to a hashed key (a config the keys cannot explain) is refused too.
std::vector<ConfigChange> check_resume_changes(const std::string& checkpoint_file,
                                               const ConfigValues& checkpoint,
                                               const ConfigValues& now, bool hashes_differ);

}  // namespace lockstep::detail
