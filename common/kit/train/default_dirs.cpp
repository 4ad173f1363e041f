// The build's data folders (default_dirs.h): the one file compiled with their names.
#include "kit/train/default_dirs.h"

namespace kit {

#ifndef KIT_DEFAULT_DATA_DIR
#define KIT_DEFAULT_DATA_DIR nullptr
#endif
#ifndef KIT_DEFAULT_IMAGE_DIR
#define KIT_DEFAULT_IMAGE_DIR nullptr
#endif
#ifndef KIT_DEFAULT_WEATHER_DIR
#define KIT_DEFAULT_WEATHER_DIR nullptr
#endif

const char* default_data_dir() { return KIT_DEFAULT_DATA_DIR; }
const char* default_image_dir() { return KIT_DEFAULT_IMAGE_DIR; }
const char* default_weather_dir() { return KIT_DEFAULT_WEATHER_DIR; }

}  // namespace kit
