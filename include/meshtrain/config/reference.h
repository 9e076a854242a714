#pragma once
// The configuration reference, generated from the one key list
// (src/config/schema.h): every key with its type, default (a default-built
// Config written as JSON), allowed values (choices.h), what a resume makes
// of a change (resume.h) and a description (src/config/key_docs.cpp).
// docs/config-reference.md is this text; ctest unit.config_reference fails
// when the committed file differs (scripts/dev/config-reference.sh rewrites it).
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain {

struct KeyDoc {
  const char* path;  // "model_config.n_head"; top-level keys bare ("zero_stage")
  const char* text;  // one or two sentences: meaning, unit, range, default's meaning
};

// Every description, in no particular order (unit.config_test checks that each
// schema key has one and each one names a schema key).
const std::vector<KeyDoc>& key_docs();

// The description of a dotted key path; empty when there is none.
std::string_view key_description(std::string_view path);

// docs/config-reference.md, whole.
std::string render_config_reference();

}  // namespace meshtrain
