// Every callback kiln ships, in one include (Keras's keras.callbacks):
//   Callback, CallbackList, HistoryCallback, LambdaCallback, TerminateOnNaN
//   (callback.h), ProgbarLogger (progbar.h), EarlyStopping, ModelCheckpoint,
//   BackupAndRestore, ReduceLROnPlateau, LearningRateScheduler, CSVLogger,
//   TensorBoard.
#pragma once

#include "kiln/training/backup_and_restore.h"
#include "kiln/training/callback.h"
#include "kiln/training/csv_logger.h"
#include "kiln/training/early_stopping.h"
#include "kiln/training/learning_rate_scheduler.h"
#include "kiln/training/model_checkpoint.h"
#include "kiln/training/progbar.h"
#include "kiln/training/reduce_lr_on_plateau.h"
#include "kiln/training/tensorboard.h"
