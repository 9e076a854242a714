#pragma once
// Names fixed by the on-disk format; readers check format and version so a
// directory from some other tool or a future layout fails with a clear message.
namespace meshtrain::ckpt_format {

constexpr const char* kFormat = "meshtrain-checkpoint";
constexpr int kVersion = 1;
constexpr const char* kManifest = "manifest.json";
constexpr const char* kTrainerState = "trainer_state.json";
constexpr const char* kLatest = "latest";
constexpr const char* kStagingMarker = ".tmp";  // in every directory name that is not (yet) a checkpoint

}  // namespace meshtrain::ckpt_format
