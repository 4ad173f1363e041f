#pragma once
// The data folders of the build the kit was compiled in: where a trainer looks when neither
// --data-dir nor KIT_DATA_DIR says (the generated corpus, image set and weather fields of
// common/data/). default_dirs.cpp alone is compiled with the folders' names
// (common/CMakeLists.txt): a file without <torch/torch.h>, so that the files of the flags keep
// the precompiled header and the unity build (a file with definitions of its own compiles alone,
// at 20-30 CPU-s a file).
// Each returns nullptr where the build gave no folder.
namespace kit {

const char* default_data_dir();     // exercises 01, 03-05: the corpus (data/wikitext-2)
const char* default_image_dir();    // exercise 02: the image set (data/cifar-10)
const char* default_weather_dir();  // exercise 06: the weather fields (data/era5)

}  // namespace kit
